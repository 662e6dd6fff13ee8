"""Playground-Text, the text multi-goal environment with a social partner."""

from sacglam_core.envs.goals import Goal, GoalType, SimpleGoal, UnknownGoalError, catalog
from sacglam_core.envs.playground import EnvConfig, InvalidActionError, PlaygroundText, prompt
from sacglam_core.envs.vector import VectorPlayground

__all__ = [
    "EnvConfig",
    "Goal",
    "GoalType",
    "InvalidActionError",
    "PlaygroundText",
    "SimpleGoal",
    "UnknownGoalError",
    "VectorPlayground",
    "catalog",
    "prompt",
]
