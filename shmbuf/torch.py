"""PyTorch interop: batches as tensors, and a sampler thread that feeds a device.

PyTorch is an optional dependency (``pip install torch``): ``import shmbuf`` never
imports it; this module imports it when first used.

* :func:`as_tensors` turns a sampled batch into tensors with no copy on the CPU
  (``torch.from_numpy``: writing through a tensor writes the batch), keeping keys,
  shapes and dtypes (bool stays bool) unless ``dtype`` asks for a cast.
* :class:`TorchSampler` samples in a background thread, on a handle of its own, into a
  ring of preallocated host buffers (pinned where CUDA is present), and hands out
  tensors on the device: the learner never waits for the gather, and on CUDA the
  host-to-device copy runs on a stream of its own. A batch stays valid until the next
  one is taken; ``close()`` (or leaving its ``with`` block) stops the thread and closes
  its handle. Errors of the sampling thread (an empty buffer's ``ValueError``, a
  timeout) are raised in the learner, by the ``next()`` that would have returned the
  batch.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator, Mapping

import numpy as np

from shmbuf.core.read import SampleTimeout

_POLL = 0.1  # seconds between checks for close() in the sampler thread's waits


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("shmbuf.torch needs PyTorch: pip install torch") from None
    return torch


def _cast_to(dtype: Any, key: str, array_dtype: np.dtype) -> Any:
    """The torch dtype ``key`` is cast to (None: keep). A single dtype applies to the
    floating-point and bool fields only (actions and sample indices stay integers)."""
    if isinstance(dtype, Mapping):
        return dtype.get(key)
    if dtype is not None and array_dtype.kind in "fb":
        return dtype
    return None


def _from_numpy(torch: Any, key: str, a: np.ndarray) -> Any:
    if not a.flags.writeable:
        a = a.copy()  # (torch tensors are writable: a read-only view is copied)
    try:
        return torch.from_numpy(a)
    except TypeError:
        raise TypeError(f"field {key!r}: torch has no dtype for numpy {a.dtype}; store it as a "
                        "numeric or bool dtype") from None


def as_tensors(batch: Mapping[str, Any], device: Any = None, dtype: Any = None) -> dict[str, Any]:
    """``{key: torch.Tensor}`` for a sampled batch.

    On the CPU with no cast the tensors share memory with the batch's arrays (no
    copy). ``dtype``: a ``torch.dtype`` for every floating-point and bool field (integer
    fields keep theirs), or ``{key: torch.dtype}`` per field, e.g. ``{"done":
    torch.float32}`` as stable-baselines3 hands out dones. ``device``: where the
    tensors go (``"cuda"``: one copy each, asynchronous from pinned memory).

    Examples:
        >>> import numpy as np, torch
        >>> b = {"obs": np.zeros((2, 3), np.float32), "done": np.array([True, False])}
        >>> t = as_tensors(b)
        >>> t["obs"][0, 0] = 7.0; float(b["obs"][0, 0])       # the same memory
        7.0
        >>> t["done"].dtype, as_tensors(b, dtype={"done": torch.float32})["done"].tolist()
        (torch.bool, [1.0, 0.0])
    """
    torch = _torch()
    if not isinstance(batch, Mapping):
        raise TypeError(f"as_tensors takes a batch (a mapping of name -> array), got {type(batch).__name__}")
    out = {}
    for key, a in batch.items():
        a = np.asarray(a)
        t = _from_numpy(torch, key, a)
        want = _cast_to(dtype, key, a.dtype)
        if device is not None or want is not None:
            t = t.to(device=device, dtype=want, non_blocking=t.is_pinned())
        out[key] = t
    return out


def _own_handle(buf: Any, seed: Any) -> Any:
    """A handle of the sampler thread's own on ``buf``'s buffer (its own RNG and scratch:
    the learner may go on using ``buf``)."""
    kwargs = {"seed": seed, "timeout": getattr(buf, "timeout", None) or buf.core.timeout}
    if hasattr(buf, "her"):  # an EpisodeBuffer: the relabelling is per handle
        kwargs["her"] = buf.her
    return type(buf).attach(buf.name, **kwargs)


class TorchSampler:
    """Batches of ``batch_size`` sampled in a background thread, as tensors on ``device``.

    ``buf``: a :class:`shmbuf.Buffer` or :class:`shmbuf.EpisodeBuffer`;
    ``sample_kwargs`` go to its ``sample`` (``n_step=3``, ``beta=0.6``, ...). ``prefetch``
    batches are prepared ahead (host buffers: ``prefetch + 1``, pinned on CUDA).
    ``dtype`` as in :func:`as_tensors`. ``timeout``: how long one sample may wait
    (default: the buffer handle's), and so a ``next()``.

    Examples:
        >>> import numpy as np, shmbuf
        >>> buf = shmbuf.Buffer.from_data({"obs": np.ones((10, 3), np.float32)})
        >>> with TorchSampler(buf, batch_size=4, seed=0) as batches:
        ...     b = next(batches)
        ...     b["obs"].shape, b["obs"].dtype
        (torch.Size([4, 3]), torch.float32)
        >>> buf.close()
    """

    def __init__(self, buf: Any, batch_size: int, *, device: Any = None, prefetch: int = 2,
                 dtype: Any = None, seed: Any = None, timeout: float | None = None,
                 **sample_kwargs: Any) -> None:
        torch = _torch()
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or prefetch < 1:
            raise ValueError(f"prefetch must be an int >= 1 (batches prepared ahead), got {prefetch!r}")
        self.device = torch.device("cpu" if device is None else device)
        self._cuda = self.device.type == "cuda"
        if self._cuda and not torch.cuda.is_available():
            raise RuntimeError(f"device {self.device} asked for, but torch sees no CUDA device")
        self.batch_size, self.dtype, self._kwargs = int(batch_size), dtype, sample_kwargs
        ragged = [k for k, (shape, _) in getattr(buf, "fields", {}).items() if any(not isinstance(d, int) for d in shape)]
        if ragged:
            raise ValueError(f"TorchSampler takes fixed fields only, and {ragged} are ragged: sample() the buffer "
                             "and turn each shmbuf.Jagged into a jagged tensor with .to_torch()")
        self._handle = _own_handle(buf, seed)
        core = getattr(self._handle, "core", self._handle)
        self.timeout = core.timeout if timeout is None else float(timeout)
        # a plain Buffer samples straight into a slot (no copy); the rest are copied in
        self._direct = hasattr(self._handle, "empty_batch") and not self._handle.prioritized and not sample_kwargs
        n = int(prefetch) + 1
        self._host: list[dict[str, Any] | None] = [None] * n  # {key: tensor}, made on first use
        self._dev: list[dict[str, Any] | None] = [None] * n
        self._free: queue.Queue = queue.Queue()
        self._ready: queue.Queue = queue.Queue()
        for i in range(n):
            self._free.put(i)
        self._held: int | None = None  # the slot the learner has now
        if self._cuda:
            self._stream = torch.cuda.Stream(self.device)
            self._copied = [torch.cuda.Event() for _ in range(n)]
            self._released = [torch.cuda.Event() for _ in range(n)]
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="shmbuf-TorchSampler", daemon=True)
        self._thread.start()

    # -- the sampler thread --------------------------------------------------------------

    def _sample(self, out: Any = None) -> dict[str, np.ndarray]:
        """One batch (into ``out``, if given), waiting in slices so that close() is seen;
        a slice's timeout only ends the wait once ``timeout`` has passed in all."""
        waited = 0.0
        while True:
            step = min(0.25, max(self.timeout - waited, 1e-3))
            try:
                if out is not None:
                    return self._handle.sample(self.batch_size, out=out, timeout=step)
                return self._handle.sample(self.batch_size, timeout=step, **self._kwargs)
            except SampleTimeout:
                waited += step
                if self._stop.is_set() or waited >= self.timeout:
                    raise

    def _slot(self, i: int, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Slot ``i``'s host tensors (made at the first batch, pinned on CUDA)."""
        torch = _torch()
        if self._host[i] is None:
            self._host[i] = {k: torch.empty(a.shape, dtype=_from_numpy(torch, k, a[:0]).dtype,
                                            pin_memory=self._cuda) for k, a in batch.items()}
            if self._cuda:
                self._dev[i] = {k: torch.empty(a.shape, device=self.device,
                                               dtype=_cast_to(self.dtype, k, a.dtype) or t.dtype)
                                for (k, a), t in zip(batch.items(), self._host[i].values())}
        host = self._host[i]
        if host.keys() != batch.keys():
            raise RuntimeError(f"the sampled batch's keys changed from {list(host)} to {list(batch)}")
        return host

    def _run(self) -> None:
        torch = _torch()
        try:
            while not self._stop.is_set():
                try:
                    i = self._free.get(timeout=_POLL)
                except queue.Empty:
                    continue
                if self._cuda:
                    self._copied[i].synchronize()  # the last copy out of host slot i is done
                if self._direct and self._host[i] is not None:  # straight into the slot
                    host = self._host[i]
                    self._sample({k: t.numpy() for k, t in host.items()})
                else:
                    batch = self._sample()
                    host = self._slot(i, batch)
                    for k, a in batch.items():
                        host[k].numpy()[...] = a
                if self._cuda:
                    with torch.cuda.stream(self._stream):
                        self._stream.wait_event(self._released[i])  # the learner is done with it
                        for k, t in host.items():
                            self._dev[i][k].copy_(t, non_blocking=True)
                        self._copied[i].record(self._stream)
                self._ready.put(i)
        except BaseException as exc:  # handed to the learner
            self._error = exc
            self._ready.put(None)

    # -- the learner's side ----------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        """The next batch; the one taken before is given back to be refilled."""
        torch = _torch()
        if self._stop.is_set():
            raise StopIteration
        if self._held is not None:
            if self._cuda:
                self._released[self._held].record(torch.cuda.current_stream(self.device))
            self._free.put(self._held)
            self._held = None
        try:
            i = self._ready.get(timeout=self.timeout + 5.0)
        except queue.Empty:
            raise SampleTimeout(f"TorchSampler: no batch within {self.timeout + 5.0:g} s") from None
        if i is None:
            self.close()
            raise self._error  # type: ignore[misc]
        self._held = i
        if self._cuda:
            torch.cuda.current_stream(self.device).wait_event(self._copied[i])
            return dict(self._dev[i])  # type: ignore[arg-type]
        host = self._host[i]
        if self.dtype is None:
            return dict(host)  # type: ignore[arg-type]
        return {k: t.to(_cast_to(self.dtype, k, t.numpy().dtype) or t.dtype) for k, t in host.items()}

    def close(self) -> None:
        """Stop the thread (after its current sample, at most about 0.25 s) and close its
        handle. Tensors handed out on the CPU stay valid."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.timeout + 5.0)
        if not self._thread.is_alive():
            self._handle.close()

    def __enter__(self) -> "TorchSampler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
