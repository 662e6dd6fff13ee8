"""A vector of Playground-Text environments stepping in lockstep (paper, Appendix C: 32 of them).

It follows Gymnasium's vector API with same-step autoreset: an environment whose episode ends is reset
at once, its returned observation is the new episode's first, and the finished episode's last
observation and step info are in `infos["final_obs"][i]` and `infos["final_info"][i]`. Text does not
fit Gymnasium's fixed spaces, so observations are a list of strings and `infos` a dict of lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sacglam_core.envs.playground import EnvConfig, InvalidActionError, PlaygroundText


def env_seeds(seed: int, num_envs: int) -> list[int]:
    """Independent per-environment seeds derived from one integer."""
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(num_envs)]


class VectorPlayground:
    """`num_envs` independent environments, reproducible from one seed. `goal_source`, when set, gives the goal of
    each episode that starts without one given (None from it: the environment draws its own)."""

    def __init__(self, num_envs: int = 32, config: EnvConfig | None = None, seed: int | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.num_envs = num_envs
        self.config = config or EnvConfig()
        self.envs = [PlaygroundText(self.config) for _ in range(num_envs)]
        self.goal_source: Callable[[], str | None] | None = None
        self._seed(seed)

    def _seed(self, seed: int | None) -> None:
        if seed is not None:
            for env, s in zip(self.envs, env_seeds(seed, self.num_envs)):
                env.rng.seed(s)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list[str], dict]:
        """Reset every environment; `options["goals"]` may fix one goal per environment."""
        self._seed(seed)
        goals = (options or {}).get("goals")
        if goals is not None and len(goals) != self.num_envs:
            raise ValueError(f"options['goals'] has {len(goals)} goals for {self.num_envs} environments")
        results = [self._reset(env, g) for env, g in zip(self.envs, goals or [None] * self.num_envs)]
        obs = [o for o, _ in results]
        return obs, self._stack([i for _, i in results], [None] * self.num_envs, [None] * self.num_envs)

    def step(self, actions: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every environment, or none: every action is checked before any environment steps."""
        if len(actions) != self.num_envs:
            raise ValueError(f"got {len(actions)} actions for {self.num_envs} environments")
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            try:
                env.check_action(action)
            except InvalidActionError as error:
                raise InvalidActionError(f"environment {i}: {error}") from None
        n = self.num_envs
        obs: list[str] = [""] * n
        infos: list[dict] = [{}] * n
        rewards = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        final_obs: list[str | None] = [None] * n
        final_info: list[dict | None] = [None] * n
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            o, rewards[i], terminated[i], truncated[i], info = env.step(action)
            if terminated[i] or truncated[i]:
                final_obs[i], final_info[i] = o, info
                o, info = self._reset(env)
            obs[i], infos[i] = o, info
        return obs, rewards, terminated, truncated, self._stack(infos, final_obs, final_info)

    def _reset(self, env: PlaygroundText, goal: str | None = None) -> tuple[str, dict]:
        if goal is None and self.goal_source is not None:
            goal = self.goal_source()
        return env.reset(options=None if goal is None else {"goal": goal})

    @staticmethod
    def _stack(infos: list[dict], final_obs: list, final_info: list) -> dict:
        return {
            "goal": [i["goal"] for i in infos],
            "possible_actions": [i["possible_actions"] for i in infos],
            "achieved_goals": [i["achieved_goals"] for i in infos],
            "final_obs": final_obs,
            "final_info": final_info,
        }

    def state_dict(self) -> dict:
        return {"envs": [env.state_dict() for env in self.envs]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["envs"]) != self.num_envs:
            raise ValueError(f"state holds {len(state['envs'])} environments, this vector has {self.num_envs}")
        for env, s in zip(self.envs, state["envs"]):
            env.load_state_dict(s)
