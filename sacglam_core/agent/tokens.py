"""Token ids of prompts and actions, composed from cached parts so that transitions stay compact.

A prompt is `Goal: <goal>\n<observation>\nAction:` (paper, Figure 3). Its ids are the ids of the goal
line, the observation and the `Action:` suffix, concatenated, with the tokenizer's special tokens
around them. Storing a goal and an observation separately then costs nothing when hindsight
relabelling swaps the goal.
"""

from __future__ import annotations

from functools import lru_cache


class PromptTokens:
    def __init__(self, tokenizer, cache_size: int = 200_000) -> None:
        self.tokenizer = tokenizer
        full = tokenizer("x").input_ids
        bare = tokenizer("x", add_special_tokens=False).input_ids
        start = next(i for i in range(len(full)) if full[i : i + len(bare)] == bare)
        self.prefix, self.suffix = full[:start], full[start + len(bare) :]
        self.action_suffix = self.encode("Action:")
        self.goal = lru_cache(maxsize=None)(self._goal)
        self.observation = lru_cache(maxsize=cache_size)(self.encode)
        self.action = lru_cache(maxsize=None)(self.encode)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _goal(self, goal: str) -> list[int]:
        return self.encode(f"Goal: {goal}")

    def join(self, goal_ids: list[int], observation_ids: list[int]) -> list[int]:
        return self.prefix + goal_ids + observation_ids + self.action_suffix + self.suffix

    def prompt(self, goal: str, observation: str) -> list[int]:
        return self.join(self.goal(goal), self.observation(observation))

    def actions(self, actions: list[str]) -> list[list[int]]:
        return [self.action(a) for a in actions]
