"""A short run's configuration on the tiny models, shared by the tests that train one."""

from pathlib import Path

import yaml


def write_config(path: Path, model: Path, /, **settings) -> Path:
    config = {
        "model": {"name_or_path": str(model), "check_host_reads": True},
        "output_dir": str(path.parent / "out"),
        "total_steps": 384,
        "num_envs": 8,
        "threads": 1,
        "env": {"n_objects": 3, "simplified": True, "max_steps": 8},
        "eval": {"every_steps": 128, "episodes_per_type": 4, "test_episodes": 4},
        "checkpoint": {"every_updates": 4},
    }
    for key, value in settings.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path
