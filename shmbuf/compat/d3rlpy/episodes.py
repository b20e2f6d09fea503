"""Episodes for the d3rlpy facade's pickers and slicers: the handle's episode in
progress, kept in the process as d3rlpy keeps it, and an episode read out of shared
memory through the checked gather (for pickers and slicers that are not d3rlpy's
built-ins).

Both are d3rlpy episodes to the callables that receive them: ``observations`` (an
array, or a list for tuple observations), ``actions``, ``rewards (T, 1)``,
``terminated``, ``size()``, ``len()``, ``transition_count`` (``T`` if terminated, else
``T - 1``: the last observation is the next one of the step before).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from shmbuf.episodes import gather
from shmbuf.episodes.rows import FINAL, TERMINATED
from shmbuf.compat.d3rlpy.types import Signature, episode_class


class Active:
    """The steps appended since the last ``clip_episode`` (d3rlpy's active episode),
    in arrays that grow by doubling up to ``cache_size`` steps."""

    terminated = False

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], np.dtype]], obs: Sequence[str], cache_size: int) -> None:
        self._fields, self._obs, self.cache_size = fields, list(obs), int(cache_size)
        self._arrays = {k: np.empty((8,) + s, d) for k, (s, d) in fields.items()}
        self.n = 0

    def append(self, step: dict[str, np.ndarray]) -> None:
        if self.n >= self.cache_size:
            raise AssertionError("episode length exceeds cache_size.")
        if self.n == len(self._arrays["action"]):
            self._arrays = {k: np.concatenate([a, np.empty_like(a)]) for k, a in self._arrays.items()}
        for k, a in self._arrays.items():
            a[self.n] = step[k]
        self.n += 1

    @classmethod
    def of(cls, data: dict[str, np.ndarray], obs: Sequence[str]) -> "Active":
        """A whole episode's arrays (``append_episode``), without a copy step by step."""
        self = cls({k: (v.shape[1:], v.dtype) for k, v in data.items()}, obs, len(data["action"]))
        self._arrays, self.n = dict(data), len(data["action"])
        return self

    def step(self, i: int) -> dict[str, np.ndarray]:
        return {k: a[i] for k, a in self._arrays.items()}

    def clear(self) -> None:
        self.n = 0

    @property
    def observations(self) -> Any:
        obs = [self._arrays[o][:self.n] for o in self._obs]
        return obs if len(obs) > 1 else obs[0]

    @property
    def actions(self) -> np.ndarray:
        return self._arrays["action"][:self.n]

    @property
    def rewards(self) -> np.ndarray:
        return self._arrays["reward"][:self.n, None].astype(np.float32)

    def size(self) -> int:
        return self.n

    def __len__(self) -> int:
        return self.n

    @property
    def transition_count(self) -> int:
        return max(self.n - 1, 0)

    def compute_return(self) -> float:
        return float(np.sum(self.rewards))

    @property
    def observation_signature(self) -> Signature:
        return Signature(dtype=[self._fields[o][1] for o in self._obs], shape=[self._fields[o][0] for o in self._obs])

    def to_episode(self) -> Any:
        """A copy, as d3rlpy's ``Episode`` where installed (not terminated)."""
        obs = self.observations
        return episode_class()(observations=[o.copy() for o in obs] if isinstance(obs, list) else obs.copy(),
                               actions=self.actions.copy(), rewards=self.rewards, terminated=False)


def read(ebuf: Any, lane: int, start: int, obs: Sequence[str]) -> Optional[Any]:
    """The episode whose first row is row ``start`` of ``lane``, every row read through
    the checked gather, as a d3rlpy ``Episode`` (d3rlpy's class where installed): ended
    ones as d3rlpy stores them (a terminated one's steps; a cut one's steps and its last
    step, kept in its final row), one in progress as far as its
    newest published step. None if a row was torn, overwritten or of another episode
    (the caller draws again)."""
    ring = ebuf.engine.ring
    one = np.array([lane], np.int64)
    last = int(gather.last_rows(ring, one, np.array([start], np.int64), np.array([start], np.int64))[0])
    seq = np.arange(start, last + 1, dtype=np.int64)
    want = {k: np.empty((len(seq),) + s, d) for k, (s, d) in ebuf.user_fields.items()}
    want["_start"], want["_flags"] = np.empty(len(seq), np.int64), np.empty(len(seq), np.uint8)
    ok = gather.rows(ring, np.full(len(seq), lane, np.int64), seq, want)
    if not ok.all() or (want["_start"] != start).any():
        return None
    flags = want["_flags"]
    ended, terminated = bool(flags[-1] & FINAL), bool(flags[-1] & TERMINATED)
    if ended and (len(seq) < 2 or (flags[:-1] & FINAL).any()):
        return None
    rewards = want["reward"].astype(np.float32)[:, None]  # (a cut episode's final row: its last step's)
    cut = len(seq) - 1 if terminated else len(seq)  # a terminated episode's final row holds zeros
    observations = [want[o][:cut] for o in obs]
    return episode_class()(observations=observations if len(observations) > 1 else observations[0],
                           actions=want["action"][:cut], rewards=rewards[:cut], terminated=terminated)
