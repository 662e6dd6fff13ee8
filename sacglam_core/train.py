"""One training run: `python -m sacglam_core.train --config run.yaml`.

Under torchrun (or submitit's distributed environment) every process runs its share of the 32
environments with its own copy of the LLM and gradients are averaged (see distributed.py).

The run writes into `output_dir`: `config.yaml`, `metrics.csv` (one row per evaluation),
`checkpoints/` and, when finished, `done.json`. Started again on the same folder it resumes from the
newest good checkpoint and gives the same numbers as an uninterrupted run. SIGTERM or SIGUSR2 (SLURM's
time limit or preemption) and SIGINT (Ctrl-C) make it checkpoint and exit with status 75, meaning
"requeue me" (during start-up, before any step, it exits 75 without writing a checkpoint); so does the death of
the local driver that started it with --driver-pid.

Exit status: 0 finished (or already finished), 75 stopped before the end (run again to resume),
2 refused at start with one line: bad configuration, another trainer holds the directory, the directory
holds another configuration's run or is not writable, a model that cannot be found; 1 anything else.
"""

# Only light imports here: the signal handlers go in before torch and transformers load (seconds), so
# that a time-limit or preemption signal during start-up still ends in status 75, not 143.
import argparse
import importlib.util
import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: stop.set())
    parser = argparse.ArgumentParser(
        prog="python -m sacglam_core.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="run configuration (YAML)")
    parser.add_argument("--output-dir", help="overrides output_dir of the configuration")
    parser.add_argument(
        "--stop-at-steps", type=int, help="checkpoint and stop (as if preempted) after this many environment steps"
    )
    parser.add_argument(
        "--driver-pid",
        type=int,
        help="checkpoint and stop (status 75) once process PID is no longer this one's parent: the local driver that "
        "started it is gone (kill -9 leaves its children running), and the next invocation resumes the run",
    )
    args = parser.parse_args(argv)
    if args.driver_pid is not None:
        watch_driver(args.driver_pid, stop)

    from sacglam_core.config import ConfigError, load_config  # light: bad input fails before torch loads

    try:
        config = load_config(args.config, {"output_dir": args.output_dir} if args.output_dir else None)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if config.monitor.wandb != "off" and importlib.util.find_spec("wandb") is None:
        print(f"error: {args.config}: monitor.wandb: {config.monitor.wandb} needs wandb: pip install -e '.[wandb]'",
              file=sys.stderr)  # fmt: skip
        return 2

    from sacglam_core.cpu import pin_kernels

    pin_kernels()
    quiet_libraries()
    from sacglam_core.checkpoint import CheckpointError
    from sacglam_core.distributed import shutdown
    from sacglam_core.lease import LeaseHeldError
    from sacglam_core.models.loading import ModelNotFoundError
    from sacglam_core.rundir import RunDirectoryError
    from sacglam_core.trainer import Trainer

    try:
        return Trainer(config).run(stop_at_steps=args.stop_at_steps, stop=stop)
    except (ConfigError, CheckpointError, ModelNotFoundError, LeaseHeldError, RunDirectoryError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        shutdown()
        # The run has ended (finished or checkpointed): the process is only exiting. CPython's shutdown resets
        # Python-handled signals to their default action, so SLURM's USR2 (it signals every process of the step)
        # arriving then would kill a finished trainer (-12). Ignored signals stay ignored through shutdown.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def quiet_libraries() -> None:
    """Keep out of a run's log what says nothing about the run: transformers' progress bar while it loads weights
    (a screen's, in a log file), and a deprecation inside peft's calls to transformers (not this project's)."""
    import warnings

    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def watch_driver(pid: int, stop: threading.Event, interval_s: float = 1.0) -> None:
    """Set `stop` once `pid` is no longer the parent of this process (the parent's death re-parents it)."""

    def watch() -> None:
        while not stop.wait(interval_s):
            if os.getppid() != pid:
                print(f"its driver (pid {pid}) is gone: checkpointing and stopping", file=sys.stderr, flush=True)
                stop.set()

    threading.Thread(target=watch, name="driver-watch", daemon=True).start()


if __name__ == "__main__":
    raise SystemExit(main())
