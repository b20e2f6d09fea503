"""d3rlpy's data types, as :mod:`shmbuf.compat.d3rlpy` gives them (d3rlpy 2.8.1):
signatures, episodes, mini-batches, dataset info and the episode generator (plain
classes here; d3rlpy's own types where it is installed, see :func:`d3rlpy_module`)."""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
from typing import Any, Sequence

import numpy as np


_D3: Any = None


def d3rlpy_module() -> Any:
    """d3rlpy's ``dataset`` module where d3rlpy is installed (imported on first use),
    else None: the facade then returns d3rlpy's own types."""
    global _D3
    if _D3 is None:
        _D3 = False
        if importlib.util.find_spec("d3rlpy") is not None:
            import d3rlpy.dataset
            _D3 = d3rlpy.dataset
    return _D3 or None


def episode_class() -> type:
    """d3rlpy's ``Episode`` where installed, else :class:`Episode`."""
    d3 = d3rlpy_module()
    return d3.Episode if d3 else Episode


def build(name: str, local: type, fields: dict[str, Any]) -> Any:
    """d3rlpy's dataclass ``name`` (else ``local``) built by field name: fields the
    installed class does not define are left out, and fields it requires that the
    facade does not know (newer d3rlpy's ``embeddings``) are None."""
    d3 = d3rlpy_module()
    cls = getattr(d3, name) if d3 else local
    known = {f.name: f for f in dataclasses.fields(cls)}
    given = {k: v for k, v in fields.items() if k in known}
    for k, f in known.items():
        if k not in given and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            given[k] = [] if k == "transitions" else None
    return cls(**given)


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

    def __len__(self) -> int:
        return self.size()

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
class Trajectory:
    """The fields of d3rlpy's ``PartialTrajectory`` (one window, ``(L, ...)``) and
    ``TrajectoryMiniBatch`` (``(B, L, ...)``), which are the same."""
    observations: Any
    actions: np.ndarray
    rewards: np.ndarray
    returns_to_go: np.ndarray
    terminals: np.ndarray
    timesteps: np.ndarray
    masks: np.ndarray
    length: int


@dataclasses.dataclass(frozen=True)
class TrajectoryMiniBatch(Trajectory):
    """d3rlpy's ``TrajectoryMiniBatch`` (used where d3rlpy is not installed)."""

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
            out.append(episode_class()(obs, self._actions[sl], self._rewards[sl], bool(self._terminals[end])))
            start = end + 1
        return out
