"""garage's ``PathBuffer``, ``HERReplayBuffer`` and ``ReplayBuffer``, in shared memory.

Switch with one import::

    from shmbuf.compat.garage import PathBuffer, HERReplayBuffer, ReplayBuffer

``PathBuffer``: ``add_path`` stores a path (``(path_len, flat_dim)`` arrays), evicting the
oldest rows; ``sample_path()`` returns a whole path in order; ``sample_transitions`` draws
rows uniformly over every row stored, as garage does. ``HERReplayBuffer`` adds
``replay_k`` relabelled copies of each transition but the last at insertion;
``ReplayBuffer`` keeps episodes of ``time_horizon`` steps in slots. ``sample_timesteps``
returns garage's ``TimeStepBatch`` (garage needed). Behaviour of garage at 2d59480
(rlworkgroup/garage).

As in garage the schema comes from the first path (the segment is created then); each
row records its step in its path and the path's length, so any process that attaches
finds the same paths. Divergences (docs/migrate/garage.md): a key new after the first path, or a 1-D
array in it, raise ``ValueError``; values are cast into the first path's dtypes except
NaN, infinities and out-of-range integers; sampling uses the handle's own seeded
generator; ``ReplayBuffer``'s wrap-around is the correct ring.

Examples:
    >>> import numpy as np
    >>> buf = PathBuffer(5, seed=0)
    >>> buf.add_path({"obs": np.array([[1], [2], [3]])})
    >>> buf.add_path({"obs": np.array([[4], [5], [6]])})  # wraps: evicts rows 1 and 2
    >>> buf.n_transitions_stored, buf.sample_path()["obs"].ravel().tolist()
    (5, [4, 5, 6])
    >>> sorted(set(buf.sample_transitions(100)["obs"].ravel().tolist()))
    [2, 3, 4, 5, 6]
    >>> buf.clear(); buf.name is None
    True
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from shmbuf.buffer import handle as core
from shmbuf.core.batch import count
from shmbuf.core import pool
from shmbuf.core.read import Sampler, read
from shmbuf.compat import cast
from shmbuf.compat.garage.replay import ReplayBuffer
from shmbuf.compat.shared import Lazy

__all__ = ["HERReplayBuffer", "PathBuffer", "ReplayBuffer"]

_STEP, _LEN = "_step", "_len"  # each row's step in its path, and the path's length
_GOAL = ("observation", "achieved_goal", "desired_goal")


class PathBuffer(Lazy):
    """garage's ``PathBuffer``: paths of ``(path_len, flat_dim)`` arrays in one ring."""

    KIND = "garage.PathBuffer"

    def __init__(self, capacity_in_transitions: int, env_spec: Any = None, *, seed: Any = None,
                 name: Optional[str] = None, persist: bool = False) -> None:
        self._capacity = count(capacity_in_transitions, "capacity_in_transitions", 1)
        self._env_spec = env_spec
        self._rng = self._seed = np.random.default_rng(seed)
        self._name, self._persist = name, persist
        self._core = None

    @classmethod
    def attach(cls, name: str, *, seed: Any = None) -> "PathBuffer":
        """This buffer from another process, by name (after its first path)."""
        rng = np.random.default_rng(seed)
        return cls._wrap(cls._handle(name, rng), rng)

    @classmethod
    def _wrap(cls, handle: core.Buffer, rng: np.random.Generator, **more: Any) -> Any:
        """A facade over the open ``handle``; ``more``: a subclass's own attributes."""
        self = cls.__new__(cls)
        PathBuffer.__init__(self, handle.capacity, more.pop("env_spec", None))
        self._rng, self._core = rng, handle
        return self

    def clear(self) -> None:
        self._end()

    @property
    def n_transitions_stored(self) -> int:
        """Rows stored: ``min(capacity, rows ever added)``."""
        return 0 if self._core is None else len(self._core)

    # -- garage's private attributes, which its tests and its users' code read: read-only
    # views of the shared memory (a row being written may show half of it; the samples
    # never return one), never copies that go stale nor writable behind the protocol

    @property
    def _buffer(self) -> dict[str, np.ndarray]:
        """Every key's ``(capacity, flat_dim)`` array in slot order (garage's ``_buffer``;
        ``{}`` before the first path and after ``clear()``)."""
        if self._core is None:
            return {}
        return {k: self._core.engine.view(k) for k in self._core.fields if not k.startswith("_")}

    @property
    def _path_segments(self) -> "collections.deque[tuple[range, range]]":
        """garage's ``_path_segments``: each stored path's slots, oldest first, as
        ``(range, range)`` (the second empty unless the path wraps around the end): the
        paths none of whose rows was overwritten, as the rows are now (every process's)."""
        out: collections.deque = collections.deque()
        if self._core is None:
            return out
        engine, cap = self._core.engine, self._core.capacity
        head = int(engine.heads()[0])  # (one lane: garage's one ring)
        seqs = np.arange(max(head - cap, 0), head)
        steps, lengths = engine.view(_STEP)[seqs % cap], engine.view(_LEN)[seqs % cap]
        for start, n in zip(seqs[steps == 0].tolist(), lengths[steps == 0].tolist()):
            if 0 < n and start + n <= head:
                a = start % cap if start < cap or start % cap else cap  # (garage's: it starts at cap, not 0, once full)
                out.append((range(a, min(a + n, cap)), range(0, max(a + n - cap, 0))))
        return out

    @property
    def _first_idx_of_next_path(self) -> int:
        """The slot the next path starts at (garage's: ``capacity`` once a path ended there)."""
        head = 0 if self._core is None else int(self._core.engine.heads()[0])
        return head % self._core.capacity or (self._core.capacity if head else 0)

    @property
    def _transitions_stored(self) -> int:
        """garage's ``_transitions_stored``: :attr:`n_transitions_stored`."""
        return self.n_transitions_stored

    # -- writing -------------------------------------------------------------------------

    def add_path(self, path: Mapping[str, Any]) -> None:
        """Add a path: ``{key: array (path_len, flat_dim)}``, every key of the buffer.

        Raises:
            ValueError: If a key is missing from path or path has wrong shape (garage's
                messages), if the path is empty, of inconsistent lengths, or longer than
                the buffer; nothing is written then.
        """
        self._write([self._check(path)])

    def add_episode_batch(self, episodes: Any) -> None:
        """Add each episode of a garage ``EpisodeBatch`` as a path with keys
        ``observations``, ``next_observations``, ``actions`` (flattened by the batch's
        ``env_spec`` spaces), ``rewards`` and ``terminals`` (``(n, 1)``)."""
        spec = episodes.env_spec
        obs_space, act_space = spec.observation_space, spec.action_space
        for eps in episodes.split():
            terminals = np.array([getattr(s, "name", s) == "TERMINAL" for s in eps.step_types], bool)
            self.add_path({"observations": obs_space.flatten_n(eps.observations),
                           "next_observations": obs_space.flatten_n(eps.next_observations),
                           "actions": act_space.flatten_n(eps.actions),
                           "rewards": np.asarray(eps.rewards).reshape(-1, 1),
                           "terminals": terminals.reshape(-1, 1)})

    def _check(self, path: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """``path`` as arrays cast into the buffer's dtypes, checked as garage checks it."""
        if not isinstance(path, Mapping):
            raise TypeError(f"a path is a dict of (path_len, flat_dim) arrays, got {type(path).__name__}")
        arrays = {k: np.asarray(v) for k, v in path.items()}
        fields = {} if self._core is None else self._core.fields
        for key, (shape, _) in fields.items():
            if key.startswith("_"):
                continue
            if key not in arrays:
                raise ValueError(f"Key {key} missing from path.")
            if arrays[key].ndim != 2 or arrays[key].shape[1:] != shape:
                raise ValueError(f"Array {key} has wrong shape.")
        length, first = None, None
        for key, a in arrays.items():
            if key.startswith("_"):
                raise ValueError(f"path key {key!r}: keys starting with '_' are shmbuf's (each row's place "
                                 "in its path); rename it")
            if a.ndim != 2:
                raise ValueError(f"Array {key} has wrong shape.")
            if length is None:
                length, first = len(a), key
            elif len(a) != length:
                raise ValueError(f"path has inconsistent lengths between {first!r} and {key!r}.")
        if not length:
            raise ValueError("Nothing in path")
        if length > self._capacity:
            raise ValueError("Path is too long to store in buffer.")
        new = sorted(set(arrays) - set(fields))
        if fields and new:
            raise ValueError(f"keys {new} are new: a buffer in shared memory keeps the keys of its first path "
                             f"({[k for k in fields if not k.startswith('_')]}); clear() first to change them")
        return {k: cast.into(a, fields[k][1], k) for k, a in arrays.items()} if fields else arrays

    def _write(self, paths: Sequence[Mapping[str, np.ndarray]]) -> None:
        """Write checked paths, in order, in one reservation (the oldest rows go)."""
        buf = self._core
        if buf is None:
            first = paths[0]
            buf = self._create({**{k: (a.shape[1:], a.dtype) for k, a in first.items()},
                                _STEP: ((), np.int32), _LEN: ((), np.int32)})
        lengths = [len(next(iter(p.values()))) for p in paths]
        batch = {k: np.concatenate([p[k] for p in paths]) if len(paths) > 1 else paths[0][k]
                 for k in buf.fields if not k.startswith("_")}
        batch[_STEP] = np.concatenate([np.arange(n, dtype=np.int32) for n in lengths])
        batch[_LEN] = np.repeat(np.array(lengths, np.int32), lengths)
        buf.extend(batch, truncate_ok=True)  # more rows than the buffer holds: the last ones

    # -- sampling ------------------------------------------------------------------------

    def _buf(self) -> core.Buffer:
        if self._core is None:
            raise ValueError("cannot sample from an empty buffer: add a path first")
        return self._core

    def sample_transitions(self, batch_size: int) -> dict[str, np.ndarray]:
        """``batch_size`` rows, uniformly with replacement over the rows stored:
        ``{key: (batch_size, flat_dim)}``. ``ValueError`` if the buffer is empty."""
        batch = self._buf().sample(batch_size)
        del batch[_STEP], batch[_LEN]
        return batch

    def sample_timesteps(self, batch_size: int) -> Any:
        """:meth:`sample_transitions` as garage's ``TimeStepBatch`` (``terminals`` become
        ``StepType.TERMINAL`` / ``MID``, rewards flattened); needs garage installed."""
        try:
            from garage import StepType, TimeStepBatch
        except ImportError:
            raise ImportError("sample_timesteps returns garage's TimeStepBatch, and garage is not importable "
                              "here: pip install garage, or call sample_transitions (the same rows, as a "
                              "dict of arrays)") from None
        s = self.sample_transitions(batch_size)
        steps = np.array([StepType.TERMINAL if t else StepType.MID for t in s["terminals"].reshape(-1)],
                         dtype=StepType)
        return TimeStepBatch(env_spec=self._env_spec, episode_infos={}, observations=s["observations"],
                             actions=s["actions"], rewards=s["rewards"].flatten(),
                             next_observations=s["next_observations"], step_types=steps, env_infos={},
                             agent_infos={})

    def sample_path(self) -> dict[str, np.ndarray]:
        """A path with no row evicted, uniformly, in order (``ValueError``: none is)."""
        buf = self._buf()
        path = read(_Paths(buf.engine, self._rng), 1, buf.timeout)["path"][0]
        del path[_STEP], path[_LEN]
        return path

    def save(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        """Save into the directory ``path`` (see :meth:`shmbuf.Buffer.save`)."""
        return self._buf().save(path, **kwargs)

    @classmethod
    def load(cls, path: Any, **kwargs: Any) -> Any:
        """A buffer in shared memory from a :meth:`save` directory (arguments as
        :meth:`shmbuf.Buffer.load`); a ``HERReplayBuffer`` takes ``reward_fn=``."""
        reward_fn = kwargs.pop("reward_fn", None)
        handle = core.Buffer.load(path, **kwargs)
        kind = handle.engine.layout.meta.get("kind")
        if kind != cls.KIND:
            handle.unlink()
            handle.close()
            raise ValueError(f"{str(path)!r} holds a save of a {kind!r}, not of a {cls.KIND}")
        return cls._wrap(handle, handle.engine.rng, reward_fn=reward_fn)


class HERReplayBuffer(PathBuffer):
    """A :class:`PathBuffer` that adds hindsight transitions at insertion with the
    "future" strategy (garage's ``HERReplayBuffer``).

    ``add_path(path)`` takes ``observations`` and ``next_observations`` as goal
    observations: a sequence of per-step dicts with ``observation``, ``achieved_goal``
    and ``desired_goal``, a dict of ``(T, d)`` arrays with those keys, or flat ``(T, D)``
    arrays (``env_spec.observation_space`` says how they split). For each step but the
    last it adds ``replay_k`` transitions, each with the achieved goal of a strictly
    later step as desired goal, ``rewards = reward_fn(next achieved goal, goal, None)``
    and ``terminals`` False, each as its own path of one step, then the path itself.
    Observations are stored flat: the dict's parts concatenated in the order of
    ``env_spec.observation_space.spaces`` (sorted keys without one).

    Examples:
        >>> import numpy as np
        >>> def reward_fn(achieved, desired, info):
        ...     return -float(np.linalg.norm(achieved - desired) > 0.1)
        >>> buf = HERReplayBuffer(4, reward_fn, 100, None, seed=0)
        >>> goals = {"observation": np.zeros((3, 2)), "achieved_goal": [[0.], [1.], [2.]],
        ...          "desired_goal": np.full((3, 1), 9.)}
        >>> buf.add_path({"observations": goals, "next_observations": goals, "actions": np.zeros((3, 1)),
        ...               "rewards": -np.ones((3, 1)), "terminals": np.zeros((3, 1), bool)})
        >>> buf.n_transitions_stored  # 3 + (3 - 1) * 4
        11
    """

    KIND = "garage.HERReplayBuffer"

    def __init__(self, replay_k: int, reward_fn: Callable[..., Any], capacity_in_transitions: int,
                 env_spec: Any, *, seed: Any = None, name: Optional[str] = None, persist: bool = False) -> None:
        try:
            ok = float(replay_k).is_integer() and replay_k >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError("replay_k must be an integer and >= 0.")
        self._replay_k, self._reward_fn = int(replay_k), reward_fn
        super().__init__(capacity_in_transitions, env_spec, seed=seed, name=name, persist=persist)

    def _meta(self) -> dict[str, Any]:
        return {"replay_k": self._replay_k}

    @classmethod
    def attach(cls, name: str, *, reward_fn: Optional[Callable[..., Any]] = None, seed: Any = None,
               env_spec: Any = None) -> "HERReplayBuffer":
        """This buffer from another process, by name. ``reward_fn`` (a function cannot be
        shared) is needed to ``add_path`` through this handle, not to sample."""
        rng = np.random.default_rng(seed)
        return cls._wrap(cls._handle(name, rng), rng, reward_fn=reward_fn, env_spec=env_spec)

    @classmethod
    def _wrap(cls, handle: core.Buffer, rng: np.random.Generator, **more: Any) -> Any:
        self = super()._wrap(handle, rng, env_spec=more.get("env_spec"))
        self._replay_k, self._reward_fn = int(handle.engine.layout.meta["replay_k"]), more.get("reward_fn")
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._core is None:  # (its configuration, reward_fn included)
            return super().__reduce__()
        return (_attach_her, (self.name, self._reward_fn))

    def add_path(self, path: Mapping[str, Any]) -> None:
        """Add the path and its hindsight transitions (see the class); nothing is
        written if any of them is refused."""
        if self._reward_fn is None:
            raise ValueError("this handle has no reward_fn: attach with reward_fn= to add paths")
        missing = [k for k in ("observations", "next_observations", "actions", "rewards", "terminals")
                   if k not in path]
        if missing:
            raise ValueError(f"Key {missing[0]} missing from path.")
        obs, nxt = self._goals(path["observations"]), self._goals(path["next_observations"])
        flat = {k: v for k, v in path.items() if k not in ("observations", "next_observations")}
        flat["observations"], flat["next_observations"] = self._flat(obs), self._flat(nxt)
        original = self._check(flat)
        idx = np.repeat(np.arange(len(original["actions"]) - 1), self._replay_k)
        if not len(idx):
            return self._write([original])
        later = self._rng.integers(idx + 1, len(original["actions"]))  # strictly later steps
        goal = obs["achieved_goal"][later]
        rewards = [np.asarray(self._reward_fn(nxt["achieved_goal"][i], g, None)).reshape(-1)
                   for i, g in zip(idx.tolist(), goal)]
        her = {k: a[idx] for k, a in original.items()}
        her["observations"] = self._flat({**{k: v[idx] for k, v in obs.items()}, "desired_goal": goal})
        her["next_observations"] = self._flat({**{k: v[idx] for k, v in nxt.items()}, "desired_goal": goal})
        her["rewards"] = np.array(rewards).reshape(len(idx), -1)
        her["terminals"] = np.zeros_like(original["terminals"][idx])
        her = {k: cast.into(a, original[k].dtype, k) for k, a in her.items()}
        if her["rewards"].shape[1:] != original["rewards"].shape[1:]:
            raise ValueError(f"reward_fn returned {her['rewards'].shape[1]} values per transition; the path's "
                             f"rewards have {original['rewards'].shape[1]}")
        singles = [{k: a[i:i + 1] for k, a in her.items()} for i in range(len(idx))]
        self._write(singles + [original])

    def _goals(self, obs: Any) -> dict[str, np.ndarray]:
        """Goal observations as ``{part: (T, d)}``, from per-step dicts, a dict of
        arrays, or flat arrays split by ``env_spec.observation_space``."""
        if isinstance(obs, Mapping):
            parts = dict(obs)
        elif len(obs) and isinstance(obs[0], Mapping):
            parts = {k: [o[k] for o in obs] for k in obs[0]}
        else:
            flat = np.asarray(obs)
            sizes = {k: int(np.prod(s.shape)) for k, s in self._spaces().items()}
            if flat.ndim != 2 or flat.shape[1] != sum(sizes.values()):
                raise ValueError(f"flat goal observations of shape {flat.shape} do not match the observation "
                                 f"space's parts {sizes}")
            parts = dict(zip(sizes, np.split(flat, np.cumsum(list(sizes.values()))[:-1], axis=1)))
        missing = [k for k in _GOAL if k not in parts]
        if missing:
            raise ValueError(f"goal observations need {list(_GOAL)}; {missing} missing")
        out = {k: np.asarray(v) for k, v in parts.items()}
        return {k: v.reshape(len(v), -1) for k, v in out.items()}

    def _spaces(self) -> dict[str, Any]:
        spaces = getattr(getattr(self._env_spec, "observation_space", None), "spaces", None)
        if not isinstance(spaces, Mapping):
            raise ValueError("flat goal observations need env_spec.observation_space (a Dict space) to split "
                             "them; or give observations as dicts")
        return dict(spaces)

    def _flat(self, parts: Mapping[str, np.ndarray]) -> np.ndarray:
        try:
            order = list(self._spaces())
        except ValueError:
            order = sorted(parts)
        return np.concatenate([np.asarray(parts[k]) for k in order], axis=1)


def _attach_her(name: str, reward_fn: Any) -> HERReplayBuffer:
    return HERReplayBuffer.attach(name, reward_fn=reward_fn)


class _Paths(Sampler):
    """Whole paths (no row evicted), uniformly, for :func:`~shmbuf.core.read.read`: a
    batch is ``{"path": (m,) objects}``, each a dict of the path's rows in order."""

    what = "paths"

    def __init__(self, engine: Any, rng: np.random.Generator) -> None:
        self.engine, self.rng = engine, rng

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return {"path": np.empty(m, object)}

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        engine, lc = self.engine, self.engine.layout.lane_capacity
        lo, head = (int(x[0]) for x in engine.window())
        seq = np.arange(lo, head)
        starts = seq[engine.view(_STEP)[seq % lc] == 0]  # raw reads: a guide, checked by the copy
        lengths = engine.view(_LEN)[starts % lc].astype(np.int64)
        ends = starts + lengths - 1
        whole = (lengths > 0) & (ends < head)
        whole &= engine.published(0, starts)  # first and last rows published
        whole[whole] &= engine.published(0, ends[whole])
        if not whole.any():
            if int(engine.heads()[0]) != head:
                return None  # written meanwhile (what was read may be of newer rows): look again
            raise ValueError("the buffer holds no whole path (every path has rows evicted or not yet written)")
        j = self.rng.integers(whole.sum(), size=len(todo))
        return starts[whole][j], lengths[whole][j]

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        got = out["path"]
        if drawn is None:
            return np.zeros(len(got), bool)
        for i, (first, n) in enumerate(zip(*(a.tolist() for a in drawn))):
            path = pool.batch(self.engine.fields, n)
            torn = self.engine.gather(0, np.array([first], np.int64), n, list(path.values()))
            intact = torn is None and (path[_STEP] == np.arange(n)).all() and (path[_LEN] == n).all()
            got[i] = path if intact else None
        return np.array([p is not None for p in got], bool)
