"""SAC-GLAM: online RL for LLM agents with Soft Actor-Critic and hindsight relabelling.

The package's layers, each importing only from those below it (pyproject.toml's import-linter contract, which
`lint-imports` and tests/test_layers.py check):

    studies                          optional experiments' code (docs/studies/)
    benchmarks, reference            figures printed about the layers below; docs/configuration.md's generator
    pipeline/                        the workflow's side: experiments, plan, driver, budget, status, aggregation
    train, trainer                   one run: the entry point and its loop
    monitor, metrics, checkpoint,    what a run writes: progress, metrics, checkpoints, its records (runfiles,
      runfiles, lease, provenance      provenance)
    algos, evaluation, agent,        SAC, PPO, the GLAM agent, its critics, model loading
      models, goal_sampling
    replay, config, distributed,     buffers, typed configuration, ranks, the device plan
      device_plan
    envs, settings                   Playground-Text and its social partner

A change to the trainer belongs at or below `train`; nothing there imports `pipeline/`, so the trainer runs
without the workflow (a notebook, another workflow engine).
"""

# Exit status of a training run that checkpointed before its end (time limit, preemption): run it again.
EXIT_PREEMPTED = 75
# Exit status of a training run whose losses, gradients or weights went non-finite: run again, it would diverge
# again from its last finite checkpoint; change its settings (docs/trainer.md).
EXIT_DIVERGED = 3
