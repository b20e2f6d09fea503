"""d3rlpy's data types, as :mod:`shmbuf.compat.d3rlpy` gives them: signatures, episodes,
buffer kinds, transition pickers, the trajectory slicer, mini-batches, dataset info and
the episode generator (plain classes here; d3rlpy's own types where it is installed)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Optional, Sequence

import numpy as np


class ActionSpace(enum.IntEnum):
    """d3rlpy's ``ActionSpace`` values (d3rlpy's own enum is accepted wherever this one is)."""
    CONTINUOUS = 1
    DISCRETE = 2
    BOTH = 3


@dataclasses.dataclass(frozen=True)
class Signature:
    """Dtypes and shapes of an observation (several for a tuple), action or reward."""
    dtype: Sequence[Any]
    shape: Sequence[Sequence[int]]

    def sample(self) -> list[np.ndarray]:
        return [np.random.random(s).astype(d) for s, d in zip(self.shape, self.dtype)]


@dataclasses.dataclass(frozen=True)
class Episode:
    """d3rlpy's ``Episode``: ``observations (T, ...)`` (a list of arrays for tuple
    observations), ``actions (T, ...)``, ``rewards (T, 1)``, ``terminated``."""
    observations: Any
    actions: np.ndarray
    rewards: np.ndarray
    terminated: bool

    @property
    def observation_signature(self) -> Signature:
        obs = self.observations if isinstance(self.observations, (list, tuple)) else [self.observations]
        return Signature(dtype=[o.dtype for o in obs], shape=[o.shape[1:] for o in obs])

    @property
    def action_signature(self) -> Signature:
        return Signature(dtype=[self.actions.dtype], shape=[self.actions.shape[1:]])

    @property
    def reward_signature(self) -> Signature:
        return Signature(dtype=[self.rewards.dtype], shape=[self.rewards.shape[1:]])

    def size(self) -> int:
        return int(self.actions.shape[0])

    @property
    def transition_count(self) -> int:
        return self.size() if self.terminated else self.size() - 1

    def compute_return(self) -> float:
        return float(np.sum(self.rewards))

    def serialize(self) -> dict[str, Any]:
        return {"observations": self.observations, "actions": self.actions, "rewards": self.rewards,
                "terminated": self.terminated}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> "Episode":
        return cls(data["observations"], data["actions"], data["rewards"], bool(data["terminated"]))


# -- storage and sampling choices (d3rlpy's objects are accepted too) ---------------------------

class InfiniteBuffer:
    """No eviction: the replay buffer's segment holds its episodes, or ``limit`` rows
    (default :data:`DEFAULT_LIMIT`); an append past it raises ``ValueError``."""

    def __init__(self, limit: Optional[int] = None) -> None:
        self.limit = limit


class FIFOBuffer:
    """The oldest rows go first: ``limit`` rows (any ``limit >= 1``; d3rlpy's fails at 1)."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        self.limit = int(limit)


class BasicTransitionPicker:
    """One-step transitions: next observation and action, zeros after a terminal step."""
    n_steps, gamma, n_frames = 1, 0.99, 1


class MultiStepTransitionPicker(BasicTransitionPicker):
    """n-step transitions: ``reward`` the discounted sum over up to ``n_steps`` steps of
    the episode, ``interval`` how many were taken."""

    def __init__(self, n_steps: int, gamma: float) -> None:
        self.n_steps, self.gamma = int(n_steps), float(gamma)


class FrameStackTransitionPicker(BasicTransitionPicker):
    """Observations of the ``n_frames`` latest frames, concatenated on axis 0 (zeros
    before the episode's first); the buffer stores each frame once."""

    def __init__(self, n_frames: int) -> None:
        self.n_frames = int(n_frames)


class SparseRewardTransitionPicker(BasicTransitionPicker):
    """d3rlpy's picker for sparse rewards: it changes only ``rewards_to_go``, which this
    facade's transitions do not carry, so it samples as the basic picker."""

    def __init__(self, failure_return: int, step_reward: float = 0.0) -> None:
        self.failure_return, self.step_reward = failure_return, step_reward


class BasicTrajectorySlicer:
    """Windows ending at a transition, inside its episode, front-padded with zeros."""


@dataclasses.dataclass(frozen=True)
class TransitionMiniBatch:
    """d3rlpy's ``TransitionMiniBatch`` fields (used where d3rlpy is not installed)."""
    observations: Any
    actions: np.ndarray
    rewards: np.ndarray
    next_observations: Any
    next_actions: np.ndarray
    terminals: np.ndarray
    intervals: np.ndarray
    transitions: Sequence[Any] = ()

    def __len__(self) -> int:
        return int(self.actions.shape[0])


@dataclasses.dataclass(frozen=True)
class TrajectoryMiniBatch:
    """d3rlpy's ``TrajectoryMiniBatch`` fields (used where d3rlpy is not installed)."""
    observations: Any
    actions: np.ndarray
    rewards: np.ndarray
    returns_to_go: np.ndarray
    terminals: np.ndarray
    timesteps: np.ndarray
    masks: np.ndarray
    length: int

    def __len__(self) -> int:
        return int(self.actions.shape[0])


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """d3rlpy's ``DatasetInfo`` fields (used where d3rlpy is not installed)."""
    observation_signature: Signature
    action_signature: Signature
    reward_signature: Signature
    action_space: ActionSpace
    action_size: int


class EpisodeGenerator:
    """d3rlpy's ``EpisodeGenerator``: flat arrays split into episodes after each step
    whose terminal or timeout is set (terminal wins); trailing steps with neither are
    dropped; 1-D actions and rewards become ``(N, 1)``."""

    def __init__(self, observations: Any, actions: Any, rewards: Any, terminals: Any,
                 timeouts: Any = None) -> None:
        actions, rewards = np.asarray(actions), np.asarray(rewards)
        self._obs = observations
        self._actions = actions.reshape(-1, 1) if actions.ndim == 1 else actions
        self._rewards = rewards.reshape(-1, 1) if rewards.ndim == 1 else rewards
        self._terminals = np.asarray(terminals).reshape(-1)
        self._timeouts = np.zeros_like(self._terminals) if timeouts is None else np.asarray(timeouts).reshape(-1)
        assert np.any(self._terminals) or np.any(self._timeouts), \
            "No episode termination was found. Either terminals or timeouts must include non-zero values."

    def __call__(self) -> list[Episode]:
        ends = np.flatnonzero((self._terminals != 0) | (self._timeouts != 0))
        out, start = [], 0
        for end in ends.tolist():
            sl = slice(start, end + 1)
            obs = ([np.asarray(o)[sl] for o in self._obs] if isinstance(self._obs, (list, tuple))
                   else np.asarray(self._obs)[sl])
            out.append(Episode(obs, self._actions[sl], self._rewards[sl], bool(self._terminals[end])))
            start = end + 1
        return out
