"""stable-baselines3's ``HerReplayBuffer`` in shared memory: the facade's episodes with
:class:`shmbuf.HER` relabelling at sample time (``replay_buffer_class=HerReplayBuffer``
of SAC, TD3, DDPG and DQN, with ``replay_buffer_kwargs`` as SB3's).

Episodes are kept whole per env (an :class:`shmbuf.EpisodeBuffer`), so the goals come
from the sampled transition's own episode, read with the torn-read check, from another
process's writes too. ``n_sampled_goal`` virtual transitions per real one (SB3's
``her_ratio``), ``goal_selection_strategy`` ``"future"`` (as SB3's: the goal reached
after the sampled step or a later one), ``"final"`` or ``"episode"``; rewards recomputed
with the env's ``compute_reward``, once per batch.

With ``copy_info_dict=True`` each handle keeps the infos of the steps *it* added (in its
own memory: infos are Python objects, not shared), and ``compute_reward`` gets them;
steps added by other processes come with empty infos.

Divergences from SB3: an episode in progress is never joined to what a later writer adds, so
``truncate_last_trajectory`` only warns as SB3's does; SB3's bookkeeping arrays
(``ep_start``, ``ep_length``, ``infos``) do not exist.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np

from stable_baselines3.her.goal_selection_strategy import KEY_TO_GOAL_STRATEGY, GoalSelectionStrategy
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer as SB3HerReplayBuffer

from shmbuf.episodes.rows import FINAL
from shmbuf.episodes.her import HER
from shmbuf.compat.sb3.buffers import OBS, DictReplayBuffer

STRATEGY = {GoalSelectionStrategy.FUTURE: "future", GoalSelectionStrategy.FINAL: "final",
            GoalSelectionStrategy.EPISODE: "episode"}


class HerReplayBuffer(DictReplayBuffer, SB3HerReplayBuffer):
    """SB3's ``HerReplayBuffer`` in shared memory (see the module's documentation);
    ``name``, ``seed``, ``lanes``, ``rate`` and ``timeout`` as
    :class:`~shmbuf.compat.sb3.ReplayBuffer`'s.

    Examples:
        >>> import numpy as np
        >>> from gymnasium import spaces
        >>> box = spaces.Box(-1, 1, (1,))
        >>> obs_space = spaces.Dict(observation=box, achieved_goal=box, desired_goal=box)
        >>> rb = HerReplayBuffer(100, obs_space, box, env=None, n_sampled_goal=4)
        >>> rb.her_ratio, rb.goal_selection_strategy.name
        (0.8, 'FUTURE')
        >>> rb.close()
    """

    def __init__(self, buffer_size: int, observation_space: Any, action_space: Any, env: Any,
                 device: Any = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, n_sampled_goal: int = 4,
                 goal_selection_strategy: GoalSelectionStrategy | str = "future", copy_info_dict: bool = False,
                 *, name: str | None = None, seed: Any = None, lanes: int | None = None, rate: Any = None,
                 timeout: float = 10.0) -> None:
        if isinstance(goal_selection_strategy, str):
            if goal_selection_strategy.lower() not in KEY_TO_GOAL_STRATEGY:
                raise ValueError(f"goal_selection_strategy must be one of {sorted(KEY_TO_GOAL_STRATEGY)}, got "
                                 f"{goal_selection_strategy!r}")
            goal_selection_strategy = KEY_TO_GOAL_STRATEGY[goal_selection_strategy.lower()]
        if isinstance(n_sampled_goal, bool) or not isinstance(n_sampled_goal, int) or n_sampled_goal < 0:
            raise ValueError(f"n_sampled_goal must be an int >= 0, got {n_sampled_goal!r}")
        self.env = env
        self.copy_info_dict = bool(copy_info_dict)
        self._infos: Any = None  # copy_info_dict: per slot, (sequence number, info) of the steps added here
        self.goal_selection_strategy = goal_selection_strategy
        self.n_sampled_goal = n_sampled_goal
        self.her_ratio = 1 - (1.0 / (n_sampled_goal + 1))
        super().__init__(buffer_size, observation_space, action_space, device, n_envs, optimize_memory_usage,
                         handle_timeout_termination, name=name, seed=seed, lanes=lanes, rate=rate, timeout=timeout)

    def _relabelling(self) -> HER:
        keys = set(self.observation_space.spaces)
        if not {"observation", "achieved_goal", "desired_goal"} <= keys:
            raise ValueError("HerReplayBuffer needs a Dict observation space with the keys observation, "
                             f"achieved_goal and desired_goal, got {sorted(keys)}")
        return HER(STRATEGY[self.goal_selection_strategy], ratio=self.her_ratio, reward_fn=self._compute_reward,
                   achieved=f"{OBS}.achieved_goal", desired=f"{OBS}.desired_goal",
                   info_fn=self._stored_infos if self.copy_info_dict else None)

    def _compute_reward(self, achieved: Any, desired: Any, info: Any) -> Any:
        if self.env is None:
            raise RuntimeError("this HerReplayBuffer has no env to recompute rewards with: call set_env(env) "
                               "(SB3's load_replay_buffer does)")
        infos = info if self.copy_info_dict else [{} for _ in range(len(achieved))]
        return self.env.env_method("compute_reward", achieved, desired, infos, indices=[0])[0].astype("float32")

    def add(self, obs: Any, next_obs: Any, action: Any, reward: Any, done: Any, infos: list[dict[str, Any]],
            **kwargs: Any) -> None:
        super().add(obs, next_obs, action, reward, done, infos, **kwargs)
        if not self.copy_info_dict:
            return
        core = self._plain()
        if self._infos is None:
            self._infos = np.full(core.capacity, None, object)
        lc, heads = self.buffer_size, core.engine.heads()
        for lane, info, ended in zip(self._writer.lanes, infos, np.asarray(done).reshape(-1)):
            seq = int(heads[lane]) - 1 - bool(ended)  # the step's row (a final row follows an end)
            self._infos[lane * lc + seq % lc] = (seq, copy.deepcopy(info))

    def _stored_infos(self, lanes: np.ndarray, seqs: np.ndarray) -> list[dict[str, Any]]:
        """The infos this handle kept for these steps ({} for the others)."""
        lc, out = self.buffer_size, []
        for lane, seq in zip(lanes.tolist(), seqs.tolist()):
            kept = None if self._infos is None else self._infos[lane * lc + seq % lc]
            out.append(kept[1] if kept is not None and kept[0] == seq else {})
        return out

    def set_env(self, env: Any) -> None:
        """The env whose ``compute_reward`` relabelled rewards come from (SB3's)."""
        if self.env is not None:
            raise ValueError("Trying to set env of already initialized environment.")
        self.env = env

    def truncate_last_trajectory(self) -> None:
        """Warn, as SB3 does, if an episode is in progress: its newest step has no next
        observation and stays out of the samples; a later writer's steps are never
        joined to it (so there is nothing to change)."""
        flags, lc = self._view("_flags"), self.buffer_size
        heads = self._plain().engine.heads()
        sizes = self._plain().lane_sizes()
        if any(size and not flags[(int(h) - 1) % lc, lane] & FINAL for lane, (h, size) in enumerate(zip(heads, sizes))):
            warnings.warn("The last trajectory in the replay buffer will be truncated.\n"
                          "If you are in the same episode as when the replay buffer was saved,\n"
                          "you should use `truncate_last_trajectory=False` to avoid that issue.")

    def config(self) -> dict[str, Any]:
        return {**super().config(), "env": None, "n_sampled_goal": self.n_sampled_goal,
                "goal_selection_strategy": STRATEGY[self.goal_selection_strategy]}
