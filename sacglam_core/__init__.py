"""SAC-GLAM: online RL for LLM agents with Soft Actor-Critic and hindsight relabelling."""

# Exit status of a training run that checkpointed before its end (time limit, preemption): run it again.
EXIT_PREEMPTED = 75
