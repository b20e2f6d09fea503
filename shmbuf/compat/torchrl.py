"""A TorchRL replay buffer whose rows live in shared memory: TensorDicts in and out,
written by collectors in other processes, sampled by the learner.

**Why a storage, a writer and a sampler, in a TorchRL ``TensorDictReplayBuffer``.**
TorchRL splits a replay buffer into a ``Storage`` (rows at indices), a ``Writer`` (which
indices the next rows take) and a ``Sampler`` (which indices a batch reads), and its
training loops and collectors (``replay_buffer=``) talk to a ``ReplayBuffer`` made of
them. A storage alone cannot share a buffer safely: TorchRL's writers keep their cursor
in each process (two collector processes would write the same slots), and its
samplers hand the storage indices to read while other processes may be writing them (a
torn row). So all three parts are shmbuf's, over one :class:`shmbuf.Buffer`:

* :class:`SharedStorage` holds the buffer, made at the first write from the
  TensorDict's leaves (one field per nested key, ``"next.observation"``), or attached by
  name (later rows may lack keys, stored as zeros: TorchRL's storages keep the slot's
  old value there; a key the first write did not have is an error); it has TorchRL's storage interface (``len``, ``max_size``, ``_empty``,
  ``state_dict``) but rows are written and read only through the two parts below.
* :class:`SharedWriter` writes through shmbuf's write path: each process claims a lane
  and reserves its rows there, so any number of collector processes write at once.
* :class:`SharedSampler` samples through shmbuf's read path (draw, checked copy, redraw):
  no batch ever holds a row half written or overwritten while it was copied. The
  ``"index"`` TorchRL adds to a sample is each row's slot (``0 .. max_size - 1``), as
  TorchRL's storages give it; a slot is a place, so a later write may hold another row
  there.

**What is refused, loudly.** A storage is made at its first write (its fields come from
it): pickling one that has no buffer yet raises (a worker would make a private buffer of
its own, whose rows vanish with it): write a first batch in the learner first (TorchRL's
collectors do). ``rb.dumps(path)`` saves the rows with :meth:`shmbuf.Buffer.save`
(``path/storage``) and ``rb.loads(path)`` loads them back, into this storage.

:class:`SharedReplayBuffer` assembles them; it also keeps TorchRL's ``share()`` from
putting a cross-process lock around every write (TorchRL's ``share()`` makes one, held
for the whole copy, which a collector killed while writing would hold forever: shmbuf's
writes need none). Pickled (to a collector's worker process, by TorchRL's multi-process
collectors) it travels by name and attaches there.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> rb = SharedReplayBuffer(1000, batch_size=4)
    >>> _ = rb.extend(TensorDict({"obs": torch.ones(10, 3), "next": {"reward": torch.arange(10.)[:, None]}}, [10]))
    >>> batch = rb.sample()
    >>> batch["obs"].shape, batch["next", "reward"].shape, len(rb)
    (torch.Size([4, 3]), torch.Size([4, 1]), 10)
    >>> rb.close()
"""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.writers import Writer

from shmbuf.buffer.handle import Buffer

KIND = "torchrl"
SEP = "."


class SharedStorage(Storage):
    """TorchRL's ``Storage`` over a :class:`shmbuf.Buffer` of ``max_size`` rows (rounded
    down to a multiple of ``lanes``) in ``lanes`` lanes (one per process that writes at
    once); ``name``: the buffer's (made
    at the first write) or an existing one's (attached). See the module."""

    def __init__(self, max_size: int, *, name: str | None = None, lanes: int = 1, seed: Any = None,
                 timeout: float = 10.0) -> None:
        super().__init__(max_size)
        self.lanes, self.seed, self.timeout = int(lanes), seed, float(timeout)
        self.buf: Buffer | None = None
        self.keys: list[str] = []  # the fields: nested keys joined by "."
        self.row_shape: tuple[int, ...] = ()  # a row's own batch dimensions (a [4, 5] extend: 4 rows of [5])
        self.sampled: tuple[Any, TensorDictBase] | None = None  # the sampler's last batch
        self._name = name
        if name is not None:
            with contextlib.suppress(FileNotFoundError):
                self._attach(name)

    def _attach(self, name: str) -> None:
        buf = Buffer.attach(name, seed=self.seed, timeout=self.timeout)
        if buf.meta.get("kind") != KIND:
            buf.close()
            raise ValueError(f"buffer {name!r} is not a TorchRL storage (it holds {buf.meta.get('kind')!r})")
        self.buf, self.keys = buf, list(buf.fields)
        self.row_shape = tuple(buf.meta.get("row_batch", ()))
        self.max_size = buf.capacity

    @property
    def initialized(self) -> bool:
        """True once the buffer exists (TorchRL's collectors ask)."""
        return self.buf is not None

    @property
    def name(self) -> str | None:
        return self.buf.name if self.buf is not None else self._name

    def ensure(self, td: TensorDictBase) -> None:
        """Make the buffer from the first rows' leaves (one field per nested key; a row
        keeps the batch dimensions after the first, as TorchRL's ``ndim=1`` storages)."""
        if self.buf is not None:
            return
        flat = td.flatten_keys(SEP)
        fields = {k: (tuple(v.shape[1:]), _numpy_dtype(v.dtype)) for k, v in flat.items()}
        self.row_shape = tuple(td.batch_size[1:])
        self.buf = Buffer.create(fields, self.max_size // self.lanes * self.lanes, lanes=self.lanes, name=self._name, seed=self.seed,
                                 timeout=self.timeout, meta={"kind": KIND, "row_batch": list(self.row_shape)})
        self.keys = list(fields)

    def write(self, td: TensorDictBase) -> torch.Tensor:
        """Write the rows of ``td`` (along its first batch dimension) into this
        process's lane; returns their slots."""
        rows = td
        self.ensure(rows)
        if tuple(rows.batch_size[1:]) != self.row_shape:
            raise ValueError(f"rows of batch size {list(rows.batch_size)}: this buffer's rows have the batch size "
                             f"{list(self.row_shape)} after the first dimension (fixed by its first write)")
        flat = rows.flatten_keys(SEP)
        extra = sorted(set(flat.keys()) - set(self.keys))
        if extra:
            raise ValueError(f"the rows have keys {extra} the buffer does not: its keys {sorted(self.keys)} were "
                             "fixed by its first write")
        buf = self.buf
        data = {k: np.zeros((len(rows),) + s, d) for k, (s, d) in buf.fields.items() if k not in flat.keys()}
        data.update({k: v.detach().cpu().numpy() for k, v in flat.items()})  # (a key missing: zeros)
        lane = buf.claim_lane() if buf.lanes > 1 else 0
        head = int(buf.engine.heads()[lane])
        buf.extend(data, truncate_ok=True)  # (more rows than a lane holds: the last ones, as TorchRL's)
        lc = buf.capacity // buf.lanes  # (the slots: exact in a lane this process claimed)
        n = len(rows)
        kept = min(n, lc)
        slots = torch.as_tensor(lane * lc + (head + np.arange(n) - (n - kept)) % lc)
        return slots  # (rows overwritten within the extend share their slot)

    def batch(self, n: int) -> tuple[torch.Tensor, TensorDictBase]:
        """``n`` rows through shmbuf's read path: their slots, and the rows as a
        TensorDict (nested keys again)."""
        buf = self.buf
        got = buf.empty_batch(n)
        index = np.empty(n, np.int64)
        buf.engine.sample_windows(n, 1, [got[f.name] for f in buf.engine.fields], self.timeout, index=index)
        rows = TensorDict({k: torch.from_numpy(got[k]) for k in self.keys}, [n, *self.row_shape]).unflatten_keys(SEP)
        return torch.from_numpy(index), rows

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise NotImplementedError("rows are written through SharedWriter (shmbuf reserves them: a cursor of "
                                  "TorchRL's would let two processes write the same slots)")

    def get(self, index: Any) -> Any:
        if self.sampled is not None and index is self.sampled[0]:
            return self.sampled[1]
        raise NotImplementedError("rows are read through SharedSampler (drawn and copied with the torn-read "
                                  "check); reading given indices is not supported")

    def __len__(self) -> int:
        return 0 if self.buf is None else len(self.buf)

    def state_dict(self) -> dict[str, Any]:
        return {} if self.buf is None else self.buf.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            if self.buf is None:
                raise RuntimeError("load a state into a SharedStorage after its first write (its fields are fixed then)")
            self.buf.load_state_dict(state_dict)

    def _empty(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Empty the buffer, and give back this process's lane (TorchRL's collectors write
        a row in the learner to make the storage, then empty it: the lane is for a worker)."""
        if self.buf is not None:
            self.buf.clear()
            self.buf.release_lane()

    def close(self) -> None:
        if self.buf is not None:
            self.buf.close()

    def dumps(self, path: Any) -> None:
        """Save the rows into the directory ``path`` (:meth:`shmbuf.Buffer.save`)."""
        if self.buf is None:
            raise RuntimeError("this SharedStorage has no buffer yet (it is made at the first write): "
                               "nothing to dump")
        self.buf.save(path, overwrite=True)

    def loads(self, path: Any) -> None:
        """Load rows that :meth:`dumps` saved into this storage (made now if it has no
        buffer yet: with the saved fields)."""
        saved = Buffer.load(path, name=f"torchrl-load-{os.getpid()}-{secrets.token_hex(6)}")
        try:
            if saved.meta.get("kind") != KIND:
                raise ValueError(f"{path} holds no TorchRL storage's rows (it holds {saved.meta.get('kind')!r})")
            if self.buf is None:
                self.buf = Buffer.create(saved.fields, saved.capacity, lanes=saved.lanes, name=self._name,
                                         seed=self.seed, timeout=self.timeout, meta={"kind": KIND})
                self.keys = list(saved.fields)
            self.buf.load_state_dict(saved.state_dict())
        finally:
            saved.close()

    def __getstate__(self) -> dict[str, Any]:
        if self.buf is None:
            raise RuntimeError(
                "this SharedStorage has no buffer yet (it is made at its first write, from the rows' keys), so "
                "it cannot travel to another process: there each process would make a private buffer of its "
                "own. Write a first batch here before handing it on (TorchRL's collectors do), or make it "
                "with name= of a buffer that exists")
        state = self.__dict__.copy()
        state.update(buf=None, sampled=None, _name=self.name)  # by name: the other process attaches
        state.update(_mutation_revision_value=None, _last_cursor_index_value=None)  # (TorchRL's
        # multiprocessing Values, which plain pickle refuses: made again where needed; shmbuf's rows use none)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._name is not None:
            with contextlib.suppress(FileNotFoundError):
                self._attach(self._name)


class _Stateless:
    """What TorchRL asks a writer and a sampler to keep: nothing here, the buffer keeps it."""

    def _empty(self, *args: Any, **kwargs: Any) -> None:
        pass

    def dumps(self, path: Any) -> None:
        pass

    def loads(self, path: Any) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class SharedWriter(_Stateless, Writer):
    """TorchRL's ``Writer`` for a :class:`SharedStorage`: shmbuf's write path."""

    def add(self, data: Any) -> Any:
        return self.extend(data.unsqueeze(0))[0]

    def extend(self, data: Any) -> torch.Tensor:
        return self._storage.write(data)

    _base = 0  # total_added when the count last started (empty(), load_state_dict)

    @property
    def _write_count(self) -> int:
        """Rows written since this buffer was made, emptied or restored, by every
        process (TorchRL's ``write_count``)."""
        buf = self._storage.buf
        return 0 if buf is None else buf.total_added - self._base

    def _empty(self, empty_write_count: bool = True) -> None:
        count = self._write_count
        self._storage.clear()
        buf = self._storage.buf
        self._base = 0 if buf is None else buf.total_added - (0 if empty_write_count else count)

    def state_dict(self) -> dict[str, Any]:
        return {"_write_count": self._write_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        count = state_dict.get("_write_count")
        buf = self._storage.buf
        if count is not None and buf is not None:
            self._base = buf.total_added - int(count)


class SharedSampler(_Stateless, Sampler):
    """TorchRL's ``Sampler`` for a :class:`SharedStorage`: shmbuf's read path."""

    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict]:
        if storage.buf is None or len(storage) == 0:
            raise RuntimeError("Cannot sample from an empty storage.")  # (TorchRL's words)
        storage.sampled = storage.batch(batch_size)
        return storage.sampled[0], {}


class SharedReplayBuffer(TensorDictReplayBuffer):
    """A ``TensorDictReplayBuffer`` over shared memory (see the module): ``max_size``
    rows, ``lanes`` of them (one per process that writes at once: a collector worker),
    ``name`` to make it under or attach to; other arguments as TorchRL's
    (``batch_size``, ``transform``, ...)."""

    def __init__(self, max_size: int = 1_000_000, *, name: str | None = None, lanes: int = 1, seed: Any = None,
                 timeout: float = 10.0, **kwargs: Any) -> None:
        given = sorted({"storage", "sampler", "writer"} & set(kwargs))
        if given:
            raise TypeError(f"SharedReplayBuffer takes no {', '.join(given)}=: its storage, writer and sampler "
                            "are shmbuf's, all three (the torn-read check needs them together); for a storage "
                            "of your own in a TensorDictReplayBuffer of TorchRL's, use TorchRL's classes")
        storage = SharedStorage(max_size, name=name, lanes=lanes, seed=seed, timeout=timeout)
        kwargs.setdefault("collate_fn", _as_it_is)  # (the sampler's batch is a TensorDict already)
        super().__init__(storage=storage, sampler=SharedSampler(), writer=SharedWriter(), **kwargs)

    @classmethod
    def attach(cls, name: str, **kwargs: Any) -> "SharedReplayBuffer":
        """Another handle of the buffer ``name``, from any process."""
        rb = cls(name=name, **kwargs)
        if rb.buffer is None:
            raise FileNotFoundError(f"no shmbuf buffer {name!r}")
        return rb

    @property
    def name(self) -> str | None:
        """The buffer's name (None until the first write, unless given)."""
        return self._storage.name

    @property
    def buffer(self) -> Buffer | None:
        """The :class:`shmbuf.Buffer` underneath (None until the first write): its
        ``stats()``, ``save()``, lanes, ..."""
        return self._storage.buf

    def share(self, shared: bool = True) -> "SharedReplayBuffer":
        """Shared it is already: no lock around writes (see the module)."""
        self.shared = shared
        self._write_lock = contextlib.nullcontext()
        return self

    def close(self) -> None:
        """Detach (the process that made the buffer removes it)."""
        self._storage.close()


def _as_it_is(batch: Any) -> Any:
    return batch


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype
