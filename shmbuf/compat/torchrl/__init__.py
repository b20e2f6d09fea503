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
  old value there; a key the first write did not have is an error). It is a TorchRL
  ``TensorStorage``: TorchRL's own ``ReplayBuffer`` and ``TensorDictReplayBuffer`` take
  it, with their writers (in one writing process: rows are taken only at the storage's
  next slots) and samplers (``RandomSampler``, ``SamplerWithoutReplacement``,
  ``SliceSampler``), every read through the checked read (docs/migrate/torchrl.md lists
  what works over it, and what does not).
* :class:`SharedWriter` writes through shmbuf's write path: each process claims a lane
  and reserves its rows there, so any number of collector processes write at once.
* :class:`SharedSampler` samples through shmbuf's read path (draw, checked copy, redraw):
  no batch ever holds a row half written or overwritten while it was copied. The
  ``"index"`` TorchRL adds to a sample is each row's slot (``0 .. max_size - 1``), as
  TorchRL's storages give it (a lane's slots filled from its first, again after
  ``empty()``); a slot is a place, so a later write may hold another row there. :class:`SharedPrioritizedSampler` is TorchRL's ``PrioritizedSampler`` on
  shmbuf's priorities (trees in the shared memory: every process samples by the same
  priorities; an update from the learner skips rows overwritten since it sampled them).
* Reads by index (``rb[i]``, ``rb[a:b]``, ``rb.storage[i]``, iterating the storage) copy
  the rows that those slots hold through the same checked read
  (:mod:`shmbuf.compat.torchrl.slots`).
* Ragged rows (a lazy stack of TensorDicts whose entries differ in their leading
  length, as TorchRL's LLM collectors write) are kept as shmbuf's ragged fields and read
  back as TorchRL's ``LazyStackStorage`` returns them
  (:mod:`shmbuf.compat.torchrl.ragged`); :class:`SharedLazyStackStorage` is
  ``LazyStackStorage``'s drop-in (its GRPO recipe's ``storage=``).

**What is refused, loudly.** A storage is made at its first write (its fields come from
it): pickling one that has no buffer yet raises (a worker would make a private buffer of
its own, whose rows vanish with it): write a first batch in the learner first (TorchRL's
collectors do). ``rb.dumps(path)`` saves the rows with :meth:`shmbuf.Buffer.save`
(``path/storage``) and ``rb.loads(path)`` loads them back, into this storage. A state
dict is TorchRL's storages' (the rows by slot): ``rb.load_state_dict`` takes one of a
TorchRL replay buffer over ``LazyTensorStorage`` or ``LazyMemmapStorage``, and theirs
take this one's; a state the buffer cannot hold is refused before any row changes.
Writing into stored rows (``rb[i] = td``, ``set_``, ``update_``, ...) is refused.

:class:`SharedReplayBuffer` and :class:`SharedPrioritizedReplayBuffer` (TorchRL's
``TensorDictPrioritizedReplayBuffer``) assemble them; it also keeps TorchRL's ``share()`` from
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

from shmbuf.compat import require

require(__name__, "torchrl", ("torch", "tensordict", "torchrl"))

from shmbuf.compat.torchrl.buffers import SharedPrioritizedReplayBuffer, SharedReplayBuffer  # noqa: E402
from shmbuf.compat.torchrl.lazy import SharedLazyStackStorage  # noqa: E402
from shmbuf.compat.torchrl.parts import SharedPrioritizedSampler, SharedSampler, SharedWriter  # noqa: E402
from shmbuf.compat.torchrl.storage import SharedStorage  # noqa: E402

__all__ = ["SharedReplayBuffer", "SharedPrioritizedReplayBuffer", "SharedStorage", "SharedLazyStackStorage",
           "SharedWriter", "SharedSampler", "SharedPrioritizedSampler"]
