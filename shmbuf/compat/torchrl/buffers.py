"""The replay buffers users make: :class:`SharedReplayBuffer` and
:class:`SharedPrioritizedReplayBuffer` (see :mod:`shmbuf.compat.torchrl`)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import TensorDictReplayBuffer

from shmbuf.buffer.handle import Buffer
from shmbuf.compat.torchrl.parts import ROW, SharedPrioritizedSampler, SharedSampler, SharedWriter
from shmbuf.compat.torchrl.storage import SharedStorage


class SharedReplayBuffer(TensorDictReplayBuffer):
    """A ``TensorDictReplayBuffer`` over shared memory (see the module): ``max_size``
    rows, ``lanes`` of them (one per process that writes at once: a collector worker),
    ``name`` to make it under or attach to; ``arena`` and ``ragged`` for ragged rows
    (:class:`~shmbuf.compat.torchrl.storage.SharedStorage`'s); other arguments as
    TorchRL's (``batch_size``, ``transform``, ...).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> rb = SharedReplayBuffer(1000, batch_size=4)
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(10.)[:, None]}, [10]))
        >>> rb[3]["obs"].tolist(), rb[-2:]["obs"].shape
        ([3.0], torch.Size([2, 1]))
        >>> rb.close()
    """

    def __init__(self, max_size: int = 1_000_000, *, name: str | None = None, lanes: int = 1, seed: Any = None,
                 timeout: float = 10.0, arena: int | None = None, ragged: Any = None, **kwargs: Any) -> None:
        self._make(max_size, name, lanes, seed, timeout, None, dict(kwargs, arena=arena, ragged=ragged))

    def _make(self, max_size: int, name: str | None, lanes: int, seed: Any, timeout: float,
              priority: tuple[float, float, float, str] | None, kwargs: dict[str, Any]) -> None:
        rows = {"arena": kwargs.pop("arena", None), "ragged": kwargs.pop("ragged", None)}
        given = sorted({"storage", "sampler", "writer"} & set(kwargs))
        if given:
            raise TypeError(f"{type(self).__name__} takes no {', '.join(given)}=: its storage, writer and sampler "
                            "are shmbuf's, all three (the torn-read check needs them together); for a storage "
                            "of your own in a TensorDictReplayBuffer of TorchRL's, use TorchRL's classes")
        storage = SharedStorage(max_size, name=name, lanes=lanes, seed=seed, timeout=timeout,
                                priority=None if priority is None else priority[0], **rows)
        sampler = SharedSampler() if priority is None else SharedPrioritizedSampler(storage, *priority)
        kwargs.setdefault("collate_fn", _as_it_is)  # (the sampler's batch is a TensorDict already)
        super().__init__(storage=storage, sampler=sampler, writer=SharedWriter(), **kwargs)

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

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state of this buffer's, or of a TorchRL replay buffer whose storage is
        a ``TensorStorage`` (``LazyTensorStorage``, ``LazyMemmapStorage``): its rows, in
        the order its writer's ``_cursor`` gives, and its ``write_count``."""
        missing = [k for k in ("_storage", "_writer", "_transforms", "_batch_size") if k not in state_dict]
        if missing:
            raise ValueError(f"load_state_dict: the state has no {', '.join(missing)}: expected a replay buffer's "
                             "state_dict() (nothing loaded)")
        self._transform.load_state_dict(state_dict["_transforms"])  # (first: it raises before the rows change)
        self._storage.cursor = state_dict["_writer"].get("_cursor")
        try:  # (the storage checks the rows before it replaces any)
            super().load_state_dict({**state_dict, "_sampler": {}})  # (TorchRL's sampler states: none here)
        finally:
            self._storage.cursor = None

    def _refused(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("writing into stored rows (set_, set_at_, update_, write_all, rb[i] = td) is "
                                  "refused: rows are reserved and published by shmbuf's writer only, so that no "
                                  "process reads or overwrites a row being written; extend with new rows instead")

    set_ = set_at_ = update_ = write_all = __setitem__ = _refused

    def close(self) -> None:
        """Detach (the process that made the buffer removes it)."""
        self._storage.close()


class SharedPrioritizedReplayBuffer(SharedReplayBuffer):
    """TorchRL's ``TensorDictPrioritizedReplayBuffer`` over shared memory: rows drawn by
    priority ``(p + eps)**alpha``, each sample with ``"priority_weight"``, ``"index"``
    (the slot) and ``"shmbuf_row"`` (which row was there); ``update_tensordict_priority(td)`` (or ``update_priority(index,
    priority)``) from the learner sets the priorities of the rows it sampled, and only
    of those still there (a row overwritten meanwhile keeps its own). A ``priority_key``
    entry in the rows of an ``extend`` sets theirs. Other arguments as
    :class:`SharedReplayBuffer`'s.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> rb = SharedPrioritizedReplayBuffer(100, alpha=1.0, beta=1.0, batch_size=200, seed=0)
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(4.)}, [4]))
        >>> s = rb.sample()
        >>> s["td_error"] = (s["index"] == 0).float() * 99 + 1e-9  # row 0: all the priority
        >>> rb.update_tensordict_priority(s)
        >>> bool((rb.sample()["obs"] == 0).float().mean() > 0.95)
        True
        >>> rb.close()
    """

    def __init__(self, max_size: int = 1_000_000, *, alpha: float, beta: float, eps: float = 1e-8,
                 priority_key: str = "td_error", reduction: str = "max", name: str | None = None, lanes: int = 1,
                 seed: Any = None, timeout: float = 10.0, arena: int | None = None, ragged: Any = None,
                 **kwargs: Any) -> None:
        kwargs.update(priority_key=priority_key, arena=arena, ragged=ragged)
        self._make(max_size, name, lanes, seed, timeout, (alpha, beta, eps, reduction), kwargs)

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Set the priorities of the rows of a sample (``data[priority_key]``, reduced
        over a row's steps as TorchRL's ``reduction`` says): of those rows only, by
        their ``"index"`` and ``"shmbuf_row"``; a row overwritten since is skipped."""
        rows = data.get(ROW, None)
        if rows is None:
            return super().update_tensordict_priority(data)
        priority = self._get_priority_vector(data) if data.ndim else torch.as_tensor(self._get_priority_item(data))
        index = data.get("index")
        while index.shape != priority.shape:  # (rows of several steps: one index a row)
            index, rows = index[..., 0], rows[..., 0]
        self._sampler.update_priority(index, priority, rows=rows)


def _as_it_is(batch: Any) -> Any:
    return batch
