"""Learning algorithms: SAC-GLAM (sac.py) and PPO-GLAM with its hindsight variants (ppo.py)."""
