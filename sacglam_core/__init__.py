"""SAC-GLAM: online RL for LLM agents with Soft Actor-Critic and hindsight relabelling."""

# Exit status of a training run that checkpointed before its end (time limit, preemption): run it again.
EXIT_PREEMPTED = 75
# Exit status of a training run whose losses, gradients or weights went non-finite: run again, it would diverge
# again from its last finite checkpoint; change its settings (docs/trainer.md).
EXIT_DIVERGED = 3
