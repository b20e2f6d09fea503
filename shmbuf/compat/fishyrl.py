"""fishyrl's ``SequentialBuffer`` and ``convert_samples_to_tensors``, in shared memory.

Switch with one import::

    from shmbuf.compat.fishyrl import SequentialBuffer, convert_samples_to_tensors

``SequentialBuffer(capacity, validate_keys=True, seed=None)``: ``add`` one step (a dict
of per-step arrays), ``sample(batch_size, sequence_length)`` windows of consecutive steps
in the order written (they may wrap around the ring, never join the newest step to the
oldest, and cross episode boundaries as fishyrl's do), ``size``, ``is_full``,
``reset()``, ``state_dict()`` / ``load_state_dict()`` with the RNG state. As in fishyrl the
schema comes from the first ``add``: the segment is created then (``name`` is None
before) and ``reset()`` ends it. Values are cast into the field's dtype (2.7 into an
int64 field is 2) except NaN, infinities and out-of-range integers. Divergences
(docs/migrate/fishyrl.md): ``is_full`` is ``size == capacity`` (fishyrl's is never true after the first
wrap); ``state_dict`` holds copies (fishyrl's holds its arrays by reference). With
``validate_keys=False`` a key that first appears later widens the buffer as fishyrl's
does (its earlier steps hold zeros: fishyrl's hold uninitialised memory), which makes
the segment again (under a new name, unless ``name=`` was given: other processes attach
again), and a key a step lacks is written as zeros (fishyrl's keeps a stale value).
``Buffer`` is fishyrl's abstract base, which both classes implement. Behaviour of fishyrl
at 06e66af (Oafish1/FishyRL).

Examples:
    >>> import numpy as np
    >>> buf = SequentialBuffer(5, seed=0)
    >>> buf.name is None
    True
    >>> for t in range(7):
    ...     buf.add({"obs": np.full(2, t), "reward": np.float32(t)})
    >>> buf.size, buf.is_full
    (5, True)
    >>> sorted({tuple(w) for w in buf.sample(50, 3)["reward"].tolist()})
    [(2.0, 3.0, 4.0), (3.0, 4.0, 5.0), (4.0, 5.0, 6.0)]
    >>> buf.reset(); buf.name is None
    True
"""

from __future__ import annotations

import abc
import warnings
from typing import Any, Mapping, Optional

import numpy as np

from shmbuf.compat import cast
from shmbuf.compat.shared import Lazy

__all__ = ["Buffer", "IndependentVectorizedBuffer", "SequentialBuffer", "convert_samples_to_tensors"]


class Buffer(abc.ABC):
    """fishyrl's abstract buffer: what every buffer implements (subclass it for a
    buffer of your own; ``isinstance(buf, Buffer)`` holds for this module's)."""

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """Steps stored."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The buffer's state."""

    @abc.abstractmethod
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget every step."""

    @abc.abstractmethod
    def add(self, experience: Mapping[str, Any]) -> None:
        """Add a step."""

    @abc.abstractmethod
    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """A batch."""


class _Fishy(Lazy, Buffer):
    _validate_keys = True

    def _meta(self) -> dict[str, Any]:
        return {"validate_keys": bool(self._validate_keys)}

    def _fields(self, values: dict[str, np.ndarray], lead: int) -> Any:
        """The segment for a step of ``values`` (``lead`` leading env axes), made by the
        first step: with ``validate_keys`` the keys must be the buffer's both ways
        (fishyrl's error, before anything is written); without, a new key widens the
        buffer (the segment is made again with it, the steps so far kept, the new key
        zeros in them) and a missing key is written as zeros."""
        buf = self._core
        if buf is None:
            return self._create({k: (v.shape[lead:], v.dtype) for k, v in values.items()})
        fields = buf.fields
        if self._validate_keys:
            for k in list(values) + list(fields):
                if k not in values or k not in fields:
                    raise ValueError(f"Key '{k}' not common between experience and buffer.")
            return buf
        new = {k: (v.shape[lead:], v.dtype) for k, v in values.items() if k not in fields}
        if not new:
            return buf
        state, rng = buf.state_dict(), buf.engine.rng
        rows = len(state["stamps"])
        for k, (shape, dtype) in new.items():
            state["fields"][k] = (shape, dtype)
            state["data"][k] = np.zeros((rows,) + shape, dtype)
        self._end()
        self._create(state["fields"]).load_state_dict(state)
        self._core.engine.rng = rng  # type: ignore[union-attr]
        return self._core

    @property
    def size(self) -> int:
        """Steps stored (over all envs)."""
        return 0 if self._core is None else len(self._core)


class SequentialBuffer(_Fishy):
    """Steps in a ring, sampled as windows of consecutive steps (fishyrl's
    ``SequentialBuffer``), in shared memory once the first step fixes the schema."""

    KIND = "fishyrl.SequentialBuffer"
    def reset(self) -> None:  # fishyrl's name: forget every key and step (the segment ends)
        self._end()

    def __init__(self, capacity: int, validate_keys: bool = True, seed: Optional[int] = None, *,
                 name: Optional[str] = None, persist: bool = False) -> None:
        self._capacity, self._validate_keys = capacity, validate_keys
        self._rng = self._seed = np.random.default_rng(seed)  # the segments sample with it too
        self._name, self._persist = name, persist
        self._core = None

    @classmethod
    def attach(cls, name: str) -> "SequentialBuffer":
        """This buffer from another process, by name (after its first ``add``)."""
        self = cls(1)
        handle = cls._handle(name, self._rng)  # (its windows drawn with self._rng)
        self._capacity, self._validate_keys = handle.capacity, bool(handle.engine.layout.meta.get("validate_keys", True))
        self._core = handle
        return self


    # -- writing -------------------------------------------------------------------------

    def add(self, experience: Mapping[str, Any]) -> None:
        """Add one step: ``{key: value}`` without a batch axis."""
        values = {k: np.asarray(v) for k, v in experience.items()}
        buf = self._fields(values, 0)
        row = {}
        for k, (shape, dtype) in buf.fields.items():
            if k not in values:  # (validate_keys=False: a key this step lacks)
                row[k] = np.zeros(shape, dtype)
                continue
            try:
                v = np.broadcast_to(values[k], shape)
            except ValueError:
                raise ValueError(f"Key '{k}': a value of shape {values[k].shape} does not fit the "
                                 f"buffer's {shape}") from None
            row[k] = cast.into(v, dtype, k)
        buf.add(row)

    # -- reading -------------------------------------------------------------------------

    def sample(self, batch_size: int, sequence_length: int = 1) -> dict[str, np.ndarray]:
        """``batch_size`` windows of ``sequence_length`` consecutive steps, uniformly with
        replacement: ``{key: (batch_size, sequence_length, *shape)}``. ``ValueError``
        when fewer than ``sequence_length`` steps are stored."""
        if self.size < sequence_length or self._core is None:
            raise ValueError(f"cannot sample sequences of {sequence_length} steps from a buffer "
                             f"holding {self.size}")
        return self._core.sample_sequences(batch_size, sequence_length)

    @property
    def is_full(self) -> bool:
        return self.size == self._capacity

    @property
    def capacity(self) -> int:
        """Steps the buffer holds (fishyrl's ``capacity``)."""
        return self._capacity

    # -- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Copies of the steps, positions and RNG state (fishyrl's keys)."""
        return {"_capacity": self._capacity, "_validate_keys": self._validate_keys,
                "_rng": self._rng.bit_generator.state,
                "_buffer": None if self._core is None else self._core.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the following samples are the same)."""
        inner = state_dict["_buffer"]
        if int(state_dict["_capacity"]) != self._capacity:
            raise ValueError(f"state_dict is of capacity {state_dict['_capacity']}, this buffer's is {self._capacity}")
        self._restore(inner)
        self._rng.bit_generator.state = state_dict["_rng"]
        if self._core is not None:
            self._core.engine.rng = self._rng  # (the restore gave the segment a generator of its own)


class IndependentVectorizedBuffer(_Fishy):
    """One ``SequentialBuffer`` per env (fishyrl's ``IndependentVectorizedBuffer``): here
    one segment with a lane per env, so sequences never mix envs and every env's steps
    stay in order. ``add`` takes a leading env axis; ``sample`` splits the batch over the
    envs at random (equal chances, as fishyrl does: counts vary between calls) and
    concatenates the envs' windows in env order.

    Examples:
        >>> import numpy as np
        >>> buf = IndependentVectorizedBuffer(2, 10, seed=0)
        >>> for t in range(4):
        ...     buf.add({"obs": np.array([[t], [100 + t]])})
        >>> b = buf.sample(6, sequence_length=2)["obs"][..., 0]
        >>> b.shape, bool((np.diff(b, axis=1) == 1).all())
        ((6, 2), True)
        >>> buf.reset()
    """

    KIND = "fishyrl.IndependentVectorizedBuffer"
    def reset(self) -> None:
        self._end()

    def __init__(self, num_buffers: int, *buffer_args: Any, buffer_class: type = SequentialBuffer,
                 seed: Optional[int] = None, name: Optional[str] = None, persist: bool = False,
                 **buffer_kwargs: Any) -> None:
        if buffer_class is not SequentialBuffer:
            raise ValueError("shmbuf's IndependentVectorizedBuffer holds SequentialBuffer sub-buffers only "
                             f"(lanes of one segment), got buffer_class={buffer_class!r}")
        args = dict(zip(("capacity", "validate_keys"), buffer_args), **buffer_kwargs)
        self._n = self._lanes = int(num_buffers)
        self._capacity = int(args["capacity"])  # per env
        self._validate_keys = bool(args.get("validate_keys", True))
        self._rng = np.random.default_rng(seed)  # the batch split; windows: the segment's own
        self._seed, self._name, self._persist = seed, name, persist
        self._core: Optional[Any] = None

    @classmethod
    def attach(cls, name: str) -> "IndependentVectorizedBuffer":
        """This buffer from another process, by name (after its first ``add``)."""
        handle = cls._handle(name)
        self = cls(handle.lanes, handle.lane_capacity, bool(handle.engine.layout.meta.get("validate_keys", True)))
        self._core = handle
        return self

    def add(self, experience: Mapping[str, Any], mask: Optional[Any] = None) -> None:
        """Add one step of every env (``{key: (num_envs, ...)}``): row i to env i, or with
        ``mask``, rows 0, 1, ... to the selected envs in order (fishyrl's mask)."""
        values = {k: np.asarray(v) for k, v in experience.items()}
        buf = self._fields(values, 1)
        fields = buf.fields
        lanes = list(range(self._n)) if mask is None else [i for i, m in enumerate(mask) if m]
        short = [k for k, v in values.items() if v.ndim == 0 or len(v) < len(lanes)]
        if short:
            raise ValueError(f"keys {short} have fewer rows than the {len(lanes)} envs they go to "
                             "(a leading env axis is expected)")
        rows = {k: [cast.into(np.broadcast_to(values[k][j], shape), dtype, k) if k in values else
                    np.zeros(shape, dtype) for j in range(len(lanes))]
                for k, (shape, dtype) in fields.items()}  # (all checked before anything is written)
        for j, lane in enumerate(lanes):
            buf.add({k: rows[k][j] for k in fields}, lane=lane)

    def sample(self, batch_size: int, **sample_kwargs: Any) -> dict[str, np.ndarray]:
        """``batch_size`` windows (``sequence_length=`` steps each), split over the envs at
        random; ``(batch_size, sequence_length, *shape)`` per key, grouped by env."""
        if batch_size % self._n != 0:
            warnings.warn(f"batch_size {batch_size} is not divisible by the number of buffers {self._n}, "
                          "rounding down.", UserWarning, stacklevel=2)
        if self._core is None:
            raise ValueError("cannot sample from an empty buffer: add steps first")
        length = int(sample_kwargs.pop("sequence_length", 1))
        counts = np.bincount(self._rng.integers(0, self._n, batch_size), minlength=self._n)
        parts = [self._core.sample_sequences(int(c), length, lane=i) for i, c in enumerate(counts.tolist()) if c]
        return {k: np.concatenate([p[k] for p in parts]) for k in self._core.fields}

    def state_dict(self) -> dict[str, Any]:
        """``{"_rng": the split's RNG state, "_buffer": a copy of every env's steps}``."""
        return {"_rng": self._rng.bit_generator.state,
                "_buffer": None if self._core is None else self._core.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the following samples are the same)."""
        self._restore(state_dict["_buffer"])
        self._rng.bit_generator.state = state_dict["_rng"]


def convert_samples_to_tensors(samples: Mapping[str, np.ndarray], **tensor_kwargs: Any) -> dict[str, Any]:
    """``{key: torch.from_numpy(v).to(**tensor_kwargs)}`` (torch is imported here): keys
    and dtypes kept unless ``dtype=`` is given; with no device or dtype change a tensor
    shares memory with the sample."""
    try:
        import torch
    except ImportError:
        raise ImportError("convert_samples_to_tensors needs PyTorch: pip install torch") from None
    return {k: torch.from_numpy(np.asarray(v)).to(**tensor_kwargs) for k, v in samples.items()}
