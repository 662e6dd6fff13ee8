"""A scripted planner that reads the environment's state and picks an action that makes progress.

It is an oracle for tests (every goal is solvable within the horizon) and a reference policy.
"""

from __future__ import annotations

from sacglam_core.envs.goals import SimpleGoal
from sacglam_core.envs.playground import GO_TO_TEXT, GRASP, RELEASE_TEXT, PlaygroundText


def planner_action(env: PlaygroundText) -> str:
    """The next action towards the current sub-goal of `env.goal`."""
    parts = env.goal.parts
    part = parts[0] if len(parts) == 2 and not env.first_part_reached else parts[-1]
    return _grasp_action(env, part) if part.verb == "grasp" else _grow_action(env, part)


def _grasp_action(env: PlaygroundText, part: SimpleGoal) -> str:
    matching = [s for s, k in enumerate(env.kinds) if k.index in part.matches]
    held = [s for s in matching if s in env.held]
    if held:  # only under the event rule (holding would have reached it): put it down, then grasp it again
        return _release(env, held[0])
    return _fetch(env, matching)


def _grow_action(env: PlaygroundText, part: SimpleGoal) -> str:
    kinds = env.kinds
    targets = [s for s, k in enumerate(kinds) if k.index in part.matches]
    held_supplies = [s for s in env.held if kinds[s].category == "supply"]
    for target in targets:
        if any(kinds[target].grows_with(kinds[s]) for s in held_supplies):
            # Meeting happens at the destination; a held target meets its supply anywhere.
            return _go_to(env, target if target not in env.held else next(s for s, p in enumerate(env.loc) if p >= 0))
    supplies = [
        s for s, k in enumerate(kinds) if k.category == "supply" and any(kinds[t].grows_with(k) for t in targets)
    ]
    return _fetch(env, supplies)


def _fetch(env: PlaygroundText, wanted: list[int]) -> str:
    """Towards holding one of the objects in the slots `wanted`: grasp where the agent stands on one and has a hand
    free, free a hand if none is, else go to the first."""
    if env.on in wanted and len(env.held) < env.config.capacity:
        return GRASP
    if len(env.held) >= env.config.capacity:
        return _release(env, env.held[0])
    return _go_to(env, wanted[0])


def _go_to(env: PlaygroundText, slot: int) -> str:
    return GO_TO_TEXT[env.kinds[slot].index]


def _release(env: PlaygroundText, slot: int) -> str:
    return RELEASE_TEXT[env.kinds[slot].index]
