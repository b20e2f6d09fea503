"""TorchRL's ``LazyStackStorage`` in shared memory: :class:`SharedLazyStackStorage`, the
one-line switch for TorchRL's LLM recipes (its async GRPO's
``RayReplayBuffer(storage=partial(LazyStackStorage, size), ...)``)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from shmbuf.compat.torchrl.storage import SharedStorage


class SharedLazyStackStorage(SharedStorage):
    """TorchRL's ``LazyStackStorage`` (``max_size``, ``stack_dim=0``, ``device``) over a
    :class:`shmbuf.Buffer`: rows whose entries differ in their leading length (tokens,
    log-probabilities, masks of any length) kept as shmbuf's ragged fields, reads
    returned as ``LazyStackStorage`` returns them (a ``LazyStackedTensorDict`` of the rows
    for several, the row's ``TensorDict`` for one), so that ``get(key,
    as_nested_tensor=True)`` and ``as_padded_tensor=True`` give what TorchRL's give.

    Every entry with a dimension is ragged (``ragged=True``; pass keys or ``None``, see
    :class:`SharedStorage`), so later rows may have any leading length there; entries of
    one length in every row of the first write and varying there share it (checked at
    each write). ``arena``: bytes for the ragged values (default: sized at the first
    write, see :mod:`shmbuf.compat.torchrl.ragged`). ``name``, ``lanes``, ``seed``,
    ``timeout``: :class:`SharedStorage`'s. ``device``: where reads go (TorchRL's moves the
    rows there as they are written; here they stay in shared memory).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict, lazy_stack
        >>> from torchrl.data import ReplayBuffer
        >>> rb = ReplayBuffer(storage=SharedLazyStackStorage(100), batch_size=4)
        >>> _ = rb.extend(lazy_stack([TensorDict(tokens=torch.arange(n), reward=torch.tensor(n * 1.0))
        ...                           for n in (3, 5, 2)]))
        >>> batch = rb.sample()
        >>> type(batch).__name__, batch.get("tokens", as_padded_tensor=True).shape[0]
        ('LazyStackedTensorDict', 4)
        >>> [len(t) for t in rb[:].get("tokens", as_list=True)]
        [3, 5, 2]
        >>> rb.storage.close()
    """

    lazy = True

    def __init__(self, max_size: int | None = None, *, arena: int | None = None, ragged: Any = True,
                 stack_dim: int = 0, device: Any = None, compilable: bool = False, name: str | None = None,
                 lanes: int = 1, seed: Any = None, timeout: float = 10.0) -> None:
        if max_size is None:
            raise ValueError("SharedLazyStackStorage needs max_size (TorchRL's LazyStackStorage has no limit by "
                             "default): a shmbuf buffer holds that many rows, in shared memory made at the first "
                             "write")
        if stack_dim != 0:
            raise ValueError(f"stack_dim={stack_dim}: SharedLazyStackStorage stacks rows along dimension 0 only "
                             "(TorchRL's default); leave stack_dim out")
        if compilable:
            raise ValueError("compilable=True: a SharedLazyStackStorage is for processes that share it, which "
                             "TorchRL's compilable storages are not; leave compilable out")
        super().__init__(max_size, name=name, lanes=lanes, seed=seed, timeout=timeout, arena=arena, ragged=ragged)
        self.stack_dim = 0
        self.to_device = None if device is None else torch.device(device)

    def get(self, index: Any) -> Any:
        """The rows at ``index`` (:meth:`SharedStorage.get`), on ``device`` if given."""
        out = super().get(index)
        return out if self.to_device is None or not isinstance(out, TensorDictBase) else out.to(self.to_device)
