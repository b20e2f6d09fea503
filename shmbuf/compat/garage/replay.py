"""garage's ``ReplayBuffer`` (the episode-slot buffer), in shared memory; imported from
:mod:`shmbuf.compat.garage` (behaviour of garage 2021.3)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from shmbuf.core.batch import count
from shmbuf.compat import cast
from shmbuf.compat.shared import Lazy


class ReplayBuffer(Lazy):
    """Episodes of ``time_horizon`` steps in slots (garage's ``ReplayBuffer`` with the
    old ``SimpleReplayBuffer``'s ``sample``): ``add_transitions`` takes one step of B
    parallel episodes; when ``observation`` holds ``time_horizon`` steps the B episodes
    go into B slots, oldest first out. The steps of episodes not yet complete stay in
    the adding handle (each process completes its own).

    Examples:
        >>> buf = ReplayBuffer(None, 3, 1, seed=0)
        >>> for pair in ([1, 2], [3, 4], [5, 6], [7, 8]):
        ...     buf.add_transitions(observation=pair)
        >>> buf.full, buf.n_transitions_stored, sorted(set(buf.sample(100)["observation"].tolist()))
        (True, 3, [6, 7, 8])
    """

    KIND = "garage.ReplayBuffer"

    def __init__(self, env_spec: Any, size_in_transitions: int, time_horizon: int, *, seed: Any = None,
                 name: Optional[str] = None, persist: bool = False) -> None:
        self._size = count(size_in_transitions, "size_in_transitions", 1)
        self._horizon = count(time_horizon, "time_horizon", 1)
        self._capacity = self._size // self._horizon
        if self._capacity < 1:
            raise ValueError(f"size_in_transitions={size_in_transitions} holds no episode of "
                             f"time_horizon={time_horizon} steps")
        self._env_spec = env_spec
        self._rng = self._seed = np.random.default_rng(seed)
        self._name, self._persist = name, persist
        self._cache: dict[str, list[Any]] = {}
        self._core = None

    def _meta(self) -> dict[str, Any]:
        return {"size_in_transitions": self._size, "time_horizon": self._horizon}

    @classmethod
    def attach(cls, name: str, *, seed: Any = None) -> "ReplayBuffer":
        """This buffer from another process, by name (after its first episode)."""
        rng = np.random.default_rng(seed)
        handle = cls._handle(name, rng)
        described = handle.engine.layout.meta
        self = cls(None, described["size_in_transitions"], described["time_horizon"])
        self._rng, self._core = rng, handle
        return self

    def add_transition(self, **kwargs: Any) -> None:
        """Add one step of one episode (``add_transitions`` with B=1)."""
        self.add_transitions(**{k: [v] for k, v in kwargs.items()})

    def add_transitions(self, **kwargs: Any) -> None:
        """Add one step of B parallel episodes: ``key=[value of env 0, ..., env B-1]``.
        ``observation`` is required."""
        if "observation" not in kwargs:
            raise KeyError("'observation': garage's ReplayBuffer counts steps by the 'observation' key")
        if self._cache and set(kwargs) != set(self._cache):
            raise ValueError(f"keys {sorted(kwargs)} differ from this episode's {sorted(self._cache)}")
        for k, v in kwargs.items():
            self._cache.setdefault(k, []).append(np.asarray(v))
        if len(self._cache["observation"]) >= self._horizon:
            self.store_episode()

    def store_episode(self) -> None:
        """Write the cached steps as B episodes (B slots) and start new ones."""
        cache, self._cache = self._cache, {}
        try:
            episode = {k: np.swapaxes(np.stack(v), 0, 1) for k, v in cache.items()}  # (B, T, ...)
        except ValueError as exc:
            raise ValueError(f"the cached steps do not stack into episodes ({exc}); each key needs the same "
                             "shape at every step") from None
        buf = self._core
        if buf is None:
            buf = self._create({k: (a.shape[1:], a.dtype) for k, a in episode.items()})
        missing = sorted(set(buf.fields) ^ set(episode))
        if missing:
            raise ValueError(f"keys {missing} are not the buffer's ({sorted(buf.fields)})")
        buf.extend({k: cast.into(a, buf.fields[k][1], k) for k, a in episode.items()}, truncate_ok=True)

    @property
    def full(self) -> bool:
        """Every slot holds an episode."""
        return self._core is not None and self._core.is_full

    @property
    def n_transitions_stored(self) -> int:
        """Steps stored: complete episodes times ``time_horizon``."""
        return 0 if self._core is None else min(self._size, len(self._core) * self._horizon)

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """``batch_size`` steps: an episode and a step in it, each uniformly, with
        replacement; ``{key: (batch_size, ...)}``. ``ValueError`` if the buffer is empty."""
        if self._core is None:
            raise ValueError("cannot sample from an empty buffer: add a whole episode first")
        episodes = self._core.sample(batch_size)
        t = self._rng.integers(0, self._horizon, batch_size)
        return {k: v[np.arange(len(t)), t] for k, v in episodes.items()}
