"""SAC-GLAM: online RL for LLM agents with Soft Actor-Critic and hindsight relabelling."""
