"""imitation's ``buffer.Buffer`` and ``buffer.ReplayBuffer``, in shared memory.

Switch with one import::

    from shmbuf.compat.imitation import Buffer, ReplayBuffer, Transitions

Same constructors, ``store`` / ``sample`` / ``size()`` / ``from_data``, the same checks in
the same order with the same exceptions (``KeyError`` for mismatched ``sample_shapes`` and
``dtypes`` keys; ``ValueError`` for missing or extra keys, different lengths, empty
data, over capacity, wrong shapes, an empty buffer). Values are cast into the field's
dtype as imitation does (1.9 into an int field is 1), except NaN, infinities and
integers out of range, which raise ``ValueError``. What is new: each buffer is a named
shared-memory segment (``name``); another process attaches with
``Buffer.attach(name)`` / ``ReplayBuffer.attach(name)`` (or unpickles one) and stores
while this one samples. Sampling draws from numpy's global generator as imitation's does
(``np.random.randint(size, size=n)`` over the slots, which hold what imitation's would),
so a run seeded the imitation way (``np.random.seed``) repeats exactly; a buffer made or
attached with ``seed=`` draws from a generator of its own instead. Behaviour of
imitation 1.0.1 (its ``data/buffer.py`` as at e5ef188). Divergences (docs/migrate/imitation.md): capacity must be >= 1;
``ReplayBuffer`` keeps each transition's ``infos`` as a copy, of any size, in an arena of
``capacity * info_bytes`` bytes (dicts, lists, tuples, None, numbers, strings, bytes,
numpy arrays and scalars, nested; an object only pickle could keep is left out, with a
warning), where imitation keeps the Python objects themselves.

Examples:
    >>> import numpy as np
    >>> buf = Buffer(4, {"a": (2,)}, {"a": np.int32})
    >>> buf.store({"a": np.array([[0, 0], [1, 1], [2, 2]])})
    >>> buf.store({"a": np.array([[3.9, 3], [4, 4], [5, 5]])})   # cast as imitation does
    >>> buf.size(), sorted(buf.sample(100)["a"][:, 0].tolist())[0]
    (4, 2)
    >>> buf.close()
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from typing import Any, Mapping, Optional, Tuple

import numpy as np

from shmbuf.buffer import handle as core
from shmbuf.core import pool
from shmbuf.core.read import Sampler, read
from shmbuf.compat import cast
from shmbuf.compat.replay_infos import MIN_ARENA, FixedRows, Records
from shmbuf.compat.shared import Shared

KIND_BUFFER, KIND_REPLAY = "imitation.Buffer", "imitation.ReplayBuffer"


class Buffer(Shared):
    """A FIFO ring buffer for NumPy arrays of a fixed shape and dtype, sampled
    uniformly with replacement (imitation's ``buffer.Buffer``), in shared memory."""

    def __init__(self, capacity: int, sample_shapes: Mapping[str, Tuple[int, ...]],
                 dtypes: Mapping[str, Any], *, name: Optional[str] = None, seed: Any = None,
                 persist: bool = False, _kind: str = KIND_BUFFER, _arena: Optional[int] = None) -> None:
        if sample_shapes.keys() != dtypes.keys():
            raise KeyError("sample_shape and dtypes keys don't match")
        fields = {k: (tuple(sample_shapes[k]), np.dtype(dtypes[k])) for k in sample_shapes}
        self.open_over(core.Buffer.create(fields, capacity, name=name, seed=seed, persist=persist, arena=_arena,
                                      _library={"kind": _kind}), seed)

    def open_over(self, handle: core.Buffer, seed: Any = None) -> None:
        """(Once, as it is made or attached) this facade over ``handle``."""
        self._core = handle
        self._global = seed is None  # draws from numpy's global generator, as imitation's
        self.capacity: int = handle.capacity
        self.sample_shapes = {k: s for k, (s, _) in handle.fields.items()}
        self._dtypes = {k: d for k, (_, d) in handle.fields.items()}
        self._ragged = set(handle.engine.records.fields)  # (a ReplayBuffer's infos: one record a row)

    @classmethod
    def attach(cls, name: str, *, seed: Any = None) -> "Buffer":
        """This buffer from another process, by name."""
        return _attach(cls, name, seed, KIND_BUFFER)

    @classmethod
    def from_data(cls, data: Mapping[str, np.ndarray], capacity: Optional[int] = None,
                  truncate_ok: bool = False, **kwargs: Any) -> "Buffer":
        """A buffer holding ``data``; shapes and dtypes from its arrays, capacity its
        length by default. More rows than ``capacity`` raise ``ValueError`` unless
        ``truncate_ok`` (then the last ``capacity`` are kept: imitation's code, not its
        docstring)."""
        data_capacities = [len(v) for v in data.values()]
        if len(data_capacities) == 0:
            raise ValueError("No keys in data.")
        if len(set(data_capacities)) > 1:
            raise ValueError("Keys map to different length values.")
        if capacity is None:
            capacity = data_capacities[0]
        arrays = {k: np.asarray(v) for k, v in data.items()}
        buf = cls(capacity, {k: a.shape[1:] for k, a in arrays.items()},
                  {k: a.dtype for k, a in arrays.items()}, **kwargs)
        return buf._or_remove(lambda: buf.store(arrays, truncate_ok=truncate_ok))

    def store(self, data: Mapping[str, np.ndarray], truncate_ok: bool = False) -> None:
        """Store ``n`` rows (``(n,) + sample_shapes[k]`` per key), replacing the oldest.
        Checked first, in imitation's order; on any error nothing is stored."""
        expected, got = set(self.sample_shapes), set(data)
        if expected - got:
            raise ValueError(f"Missing keys {expected - got}")
        if got - expected:
            raise ValueError(f"Unexpected keys {got - expected}")
        arrays = {k: np.asarray(v) for k, v in data.items()}
        lengths = {len(a) if a.ndim else -1 for a in arrays.values()}
        if len(lengths) > 1:
            raise ValueError("Keys map to different length values.")
        n = lengths.pop()
        if n <= 0:
            raise ValueError("Trying to store empty data.")
        if n > self.capacity:
            if not truncate_ok:
                raise ValueError("Not enough capacity to store data.")
            arrays = {k: a[-self.capacity:] for k, a in arrays.items()}
        for k, a in arrays.items():
            if a.shape[1:] != self.sample_shapes[k] and k not in self._ragged:
                raise ValueError(f"Wrong data shape for {k}: expected {self.sample_shapes[k]} per row, "
                                 f"got {a.shape[1:]}")
        self._write({k: list(a) if k in self._ragged else cast.into(a, self._dtypes[k], k) for k, a in arrays.items()})

    def _write(self, rows: dict[str, Any]) -> None:
        """Write the checked, cast ``rows`` (a ReplayBuffer's rows: in parts its arena holds)."""
        self._core.extend(rows)

    def sample(self, n_samples: int) -> Mapping[str, np.ndarray]:
        """``n_samples`` rows drawn uniformly with replacement: ``{k: (n_samples,) +
        sample_shapes[k]}`` (copies). ``ValueError`` if the buffer is empty."""
        if self.size() == 0:
            raise ValueError("Buffer is empty")
        if not self._global:
            return self._core.sample(n_samples)
        return self._core.engine.sample(n_samples, n_samples, None, lambda t: self._sample_global(n_samples, t))

    def _sample_global(self, n: int, timeout: float) -> dict[str, np.ndarray]:
        engine = self._core.engine
        deadline = time.monotonic() + timeout
        # (the records' part: a ReplayBuffer's infos read in, rows whose record was covered
        # meanwhile drawn again; a buffer without ragged fields: the rows as they are)
        return engine.records.finish(read(_Global(engine), n, timeout),
                                     lambda m: read(_Global(engine), m, max(0.0, deadline - time.monotonic())),
                                     deadline, timeout)

    def size(self) -> Optional[int]:
        """The number of samples stored in the buffer."""
        return len(self._core)

    # imitation's private attributes, which its tests and its users' code read: read-only
    # views of the shared memory, never copies that go stale nor writable behind the protocol
    @property
    def _idx(self) -> int:
        """The slot the next stored row goes to (imitation's ``Buffer._idx``)."""
        return int(self._core.engine.heads()[0]) % self.capacity

    @property
    def _n_data(self) -> int:
        """The rows stored (imitation's ``Buffer._n_data``)."""
        return self.size()

    @property
    def _arrays(self) -> dict[str, np.ndarray]:
        """Every key's ``(capacity,) + shape`` array in slot order (imitation's
        ``Buffer._arrays``): read-only views of the shared memory, so they show every
        process's rows as they are written (a row being written may show half of it;
        ``sample`` never returns one); unwritten slots hold zeros."""
        return {k: self._core.engine.view(k) for k in self.sample_shapes if k not in self._ragged}


class _Global(Sampler):
    """imitation's draw, ``np.random.randint(size, size=n)`` over the slots, each slot
    read through the engine's checked copy (a row being written is drawn again, from
    the same global generator)."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.fields = engine, engine.fields

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return pool.batch(self.fields, m)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        lo, head = window = self.engine.window()
        size = int(head[0] - lo[0])
        if size == 0:
            raise ValueError("Buffer is empty")
        ind = np.random.randint(size, size=len(todo))
        if size < self.engine.layout.lane_capacity:
            # the window's rows from its oldest: imitation's slots 0.. (lo is 0) until the ring
            # is full, and the rows left when a ReplayBuffer's oldest left early (their
            # infos' arena wrapped: lo > 0), where slot i may hold a row that left
            return (lo[0] + ind).astype(np.int64)
        return self.engine.rows_at(0, ind, window).astype(np.int64)  # the rows those slots hold now

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        return self.engine.gather(0, drawn, 1, list(out.values()))


class _Transitions(Buffer):
    """A ReplayBuffer's rows: a Buffer whose ``infos`` field holds each row's dict (its
    ``_arrays["infos"]`` decodes them, as imitation's holds the dicts): a record of any
    size per row (:func:`shmbuf.compat.records.pack`), or, in a segment an older shmbuf
    made, ``info_bytes`` bytes of the row (:func:`shmbuf.compat.infos.encode`)."""

    def open_over(self, handle: core.Buffer, seed: Any = None) -> None:
        super().open_over(handle, seed)
        if "infos" in self._ragged:
            self.infos: Any = Records(handle.stats()["lanes"][0]["arena_bytes"])
        elif "infos" in self.sample_shapes:
            self.infos = FixedRows(self.sample_shapes["infos"][0])
        else:
            self.infos = None

    def encode(self, infos: Any, n: int) -> np.ndarray:
        """``n`` rows of encoded ``infos`` (None: empty dicts); warns once per handle of
        the keys it left out."""
        if infos is not None and len(infos) != n:
            raise ValueError(f"infos has {len(infos)} entries for {n} transitions")
        out, left = self.infos.encode(infos, n)
        if left and not getattr(self, "_warned", False):
            self._warned = True
            warnings.warn(f"infos keys {left} were left out of the replay buffer's rows: "
                          + self.infos.WHY, stacklevel=4)
        return out

    def _write(self, rows: dict[str, Any]) -> None:
        parts = self.infos.parts(rows) if self.infos is not None else [slice(None)]
        for part in parts:
            self._core.extend({k: v[part] for k, v in rows.items()} if len(parts) > 1 else rows)

    @property
    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = super()._arrays
        if self.infos is not None:  # (the dicts: a copy, as they are now)
            arrays["infos"] = self.infos.slots(self._core)
        return arrays


def _attach(cls: type, name: str, seed: Any, kind: str) -> Any:
    handle = core.Buffer.attach(name, seed=seed)
    held = handle.engine.layout.meta.get("kind", "shmbuf.Buffer")
    if held != kind:
        handle.close()
        raise ValueError(f"buffer {name!r} is not an imitation {kind.split('.')[1]} (it is a {held!r})")
    self = object.__new__(cls)
    if cls is ReplayBuffer:
        inner = object.__new__(_Transitions)
        inner.open_over(handle, seed)
        self._buffer = inner
        self.capacity = inner.capacity
    else:
        self.open_over(handle, seed)
    return self


@dataclasses.dataclass(frozen=True)
class Transitions:
    """obs-act-obs triples (imitation's ``types.Transitions``): ``obs``, ``acts``,
    ``infos``, ``next_obs``, ``dones``, checked as imitation checks them."""

    obs: np.ndarray
    acts: np.ndarray
    infos: np.ndarray
    next_obs: np.ndarray
    dones: np.ndarray

    def __post_init__(self) -> None:
        if len(self.obs) != len(self.acts):
            raise ValueError(f"obs and acts must have same number of timesteps: {len(self.obs)} != {len(self.acts)}")
        if len(self.infos) != len(self.obs):
            raise ValueError(f"obs and infos must have same number of timesteps: {len(self.obs)} != {len(self.infos)}")
        if np.shape(self.obs) != np.shape(self.next_obs):
            raise ValueError(f"obs and next_obs must have same shape: {np.shape(self.obs)} != {np.shape(self.next_obs)}")
        if np.asarray(self.obs).dtype != np.asarray(self.next_obs).dtype:
            raise ValueError(f"obs and next_obs must have the same dtype: {np.asarray(self.obs).dtype} != "
                             f"{np.asarray(self.next_obs).dtype}")
        if np.shape(self.dones) != (len(self.acts),):
            raise ValueError(f"dones must be 1D array, one entry for each timestep: {np.shape(self.dones)} != "
                             f"({len(self.acts)},)")
        if np.asarray(self.dones).dtype != bool:
            raise ValueError(f"dones must be boolean, not {np.asarray(self.dones).dtype}")

    def __len__(self) -> int:
        return len(self.obs)


@functools.lru_cache(maxsize=None)
def _transitions_type() -> type:
    """imitation's own Transitions where imitation is installed, else this module's (found
    once: a failed import searched the path again at every sample, about 1 ms)."""
    try:
        from imitation.data.types import Transitions as Real
    except ImportError:
        return Transitions
    return Real


class ReplayBuffer(Shared):
    """Buffer for Transitions (imitation's ``buffer.ReplayBuffer``), in shared memory.
    Rewards are not stored (imitation's do not either). ``infos``: each transition's
    value (a dict, of any size) is kept with its row, without pickle, and read back equal,
    with its types: dicts, lists, tuples, None, numbers, strings, bytes, numpy arrays and
    scalars, nested (:func:`shmbuf.compat.records.pack`); a value of any other class (an
    object only pickle could keep) is left out with its key, with a warning. The infos
    lie in an arena of ``capacity * info_bytes`` bytes (at least 1 MiB): ``info_bytes``
    (default 256) is what a row's infos take on average; rows whose infos take more
    leave early (``size()`` is then below ``capacity``). ``info_bytes=0`` keeps none
    (``sample`` gives an empty dict each). One transition's infos larger than the arena
    is refused (``ValueError``, nothing stored).

    Examples:
        >>> import numpy as np
        >>> rb = ReplayBuffer(8, obs_shape=(1,), act_shape=(), obs_dtype=np.float32, act_dtype=np.int64, seed=0)
        >>> infos = np.array([{"big": np.arange(50_000), "episode": {"r": 1.5}}, {}], dtype=object)
        >>> rb.store(Transitions(obs=np.zeros((2, 1), np.float32), acts=np.arange(2), infos=infos,
        ...                      next_obs=np.zeros((2, 1), np.float32), dones=np.zeros(2, bool)))
        >>> s = rb.sample(8)
        >>> [(len(i["big"]), i["episode"]) if a == 0 else i for a, i in zip(s.acts, s.infos)][:2] in (
        ...     [(50000, {"r": 1.5})] * 2, [(50000, {"r": 1.5}), {}], [{}, (50000, {"r": 1.5})], [{}, {}])
        True
        >>> rb.close()
    """

    def __init__(self, capacity: int, venv: Any = None, *, obs_shape: Optional[Tuple[int, ...]] = None,
                 act_shape: Optional[Tuple[int, ...]] = None, obs_dtype: Any = None,
                 act_dtype: Any = None, name: Optional[str] = None, seed: Any = None,
                 persist: bool = False, info_bytes: int = 256) -> None:
        params = (obs_shape, act_shape, obs_dtype, act_dtype)
        if venv is not None:  # one message per argument the environment's spaces also give
            for given, space, what, attr in ((obs_shape, venv.observation_space, "observation", "shape"),
                                             (obs_dtype, venv.observation_space, "observation", "dtype"),
                                             (act_shape, venv.action_space, "action", "shape"),
                                             (act_dtype, venv.action_space, "action", "dtype")):
                if getattr(space, attr) is not None and given is not None:
                    raise ValueError(f"Cannot specify both {what} {attr} and also environment "
                                     f"with an {what} space that has a {attr}.")
            obs_shape = obs_shape if venv.observation_space.shape is None else tuple(venv.observation_space.shape)
            obs_dtype = obs_dtype if venv.observation_space.dtype is None else venv.observation_space.dtype
            act_shape = act_shape if venv.action_space.shape is None else tuple(venv.action_space.shape)
            act_dtype = act_dtype if venv.action_space.dtype is None else venv.action_space.dtype
        elif any(p is None for p in params):
            raise ValueError("Shape or dtype missing and no environment specified.")
        if isinstance(info_bytes, bool) or not isinstance(info_bytes, (int, np.integer)) or info_bytes < 0:
            raise ValueError(f"info_bytes must be an int >= 0 (the bytes a row's infos take on average: the arena "
                             f"holds capacity x info_bytes, at least {MIN_ARENA:,}), got {info_bytes!r}")
        self.capacity = capacity
        shapes = {"obs": tuple(obs_shape), "acts": tuple(act_shape), "next_obs": tuple(obs_shape), "dones": ()}
        dtypes = {"obs": obs_dtype, "acts": act_dtype, "next_obs": obs_dtype, "dones": bool}
        arena = None
        if info_bytes:
            shapes["infos"], dtypes["infos"] = (None,), np.uint8
            arena = max(MIN_ARENA, capacity * int(info_bytes)) if isinstance(capacity, (int, np.integer)) else MIN_ARENA
        self._buffer = _Transitions(capacity, shapes, dtypes, name=name, seed=seed, persist=persist,
                                    _kind=KIND_REPLAY, _arena=arena)

    @classmethod
    def attach(cls, name: str, *, seed: Any = None) -> "ReplayBuffer":
        """This buffer from another process, by name."""
        return _attach(cls, name, seed, KIND_REPLAY)

    @classmethod
    def from_data(cls, transitions: Any, capacity: Optional[int] = None, truncate_ok: bool = False,
                  **kwargs: Any) -> "ReplayBuffer":
        """A buffer holding ``transitions``; shapes and dtypes from them, capacity their
        length by default."""
        obs, acts = np.asarray(transitions.obs), np.asarray(transitions.acts)
        if isinstance(transitions.obs, Mapping) or obs.dtype == object:
            raise ValueError("Dictionary observations are not supported")
        buf = cls(len(obs) if capacity is None else capacity, obs_shape=obs.shape[1:], act_shape=acts.shape[1:],
                  obs_dtype=obs.dtype, act_dtype=acts.dtype, **kwargs)
        return buf._or_remove(lambda: buf.store(transitions, truncate_ok=truncate_ok))

    def store(self, transitions: Any, truncate_ok: bool = True) -> None:
        """Store obs-act-obs triples (any object with ``obs``, ``acts``, ``next_obs`` and
        ``dones``: other fields such as ``rews`` are dropped)."""
        if isinstance(transitions.obs, Mapping):
            raise ValueError("Dictionary observations are not supported")
        data = {k: getattr(transitions, k) for k in ("obs", "acts", "next_obs", "dones")}
        if "infos" in self._buffer.sample_shapes:
            data["infos"] = self._buffer.encode(getattr(transitions, "infos", None), len(data["obs"]))
        self._buffer.store(data, truncate_ok=truncate_ok)

    def sample(self, n_samples: int) -> Any:
        """A Transitions of ``n_samples`` triples (imitation's class when imitation is
        installed), with each one's ``infos`` dict (see the class)."""
        s = self._buffer.sample(n_samples)
        if "infos" in s:
            infos = self._buffer.infos.decode(s.pop("infos"))
        else:
            infos = np.empty(n_samples, dtype=object)
            infos[:] = [{} for _ in range(n_samples)]
        return _transitions_type()(obs=s["obs"], acts=s["acts"], infos=infos, next_obs=s["next_obs"],
                                   dones=s["dones"])

    def size(self) -> Optional[int]:
        """The number of samples stored in the buffer."""
        return self._buffer.size()

    def _shm(self) -> core.Buffer:
        return self._buffer.core
