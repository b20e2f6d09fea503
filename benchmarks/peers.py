"""The systems the benchmark compares, behind one small interface.

Each system is built in the benchmark process (the learner) and stays alive for the
whole run, so measurement windows of all systems can be interleaved. Writers are
forked children: they inherit the system object and call :meth:`System.writer` to
get their add function (shmbuf's writer attaches by name instead, as users do).

* ``shmbuf``: :class:`shmbuf.Buffer` (the native path), one lane per writer.
* ``shmbuf-py``: the same on the pure-Python path (``SHMBUF_PURE_PYTHON=1``).
* ``cpprb``: cpprb's ``MPReplayBuffer``, the closest shared-memory peer.
* ``naive``: what users write without a shared buffer: writers push chunks through a
  ``multiprocessing.Queue``; the learner drains it into an in-process numpy ring and
  samples that.
* ``numpy``: the in-process numpy ring with no IPC at all (one process): the floor.
* ``torchrl`` (optional, ``--torch``): TorchRL's ``ReplayBuffer(shared=True)`` over a
  ``LazyTensorStorage``; writers in processes, like cpprb.
* ``sb3`` (optional, ``--torch``): stable-baselines3's ``ReplayBuffer``: one process,
  one transition per ``add`` (it has no batched add), like the numpy floor.

Every system samples with its default call (:meth:`System.sampler`: ``buf.sample(256)``,
a new batch each call, as users write it); the systems whose API has ``out=`` also with
it (:meth:`System.sampler_out`: shmbuf's ``sample(256, out=b)``, the numpy ring's
``np.take(..., out=)``). cpprb, TorchRL and stable-baselines3 have only their default.
"""

from __future__ import annotations

import os
import queue as queue_mod
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import shmbuf

Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class Workload:
    name: str
    capacity: int
    fields: dict[str, tuple[tuple[int, ...], Any]]

    @property
    def row_bytes(self) -> int:
        return sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in self.fields.values())

    def data(self, n: int, seed: int) -> Batch:
        """Random rows of every field's dtype (done true 1% of the time)."""
        rng = np.random.default_rng(seed)
        out = {}
        for k, (shape, dtype) in self.fields.items():
            dtype = np.dtype(dtype)
            if dtype == np.bool_:
                out[k] = rng.random((n,) + shape) < 0.01
            elif dtype.kind == "f":
                out[k] = rng.standard_normal((n,) + shape, dtype=np.float32).astype(dtype)
            else:
                out[k] = rng.integers(0, 256 if dtype == np.uint8 else 18, (n,) + shape).astype(dtype)
        return out


WORKLOADS = {
    "mujoco": Workload("mujoco", 1_000_000, {
        "obs": ((17,), np.float32), "next_obs": ((17,), np.float32),
        "action": ((6,), np.float32), "reward": ((), np.float32), "done": ((), np.bool_)}),
    "atari": Workload("atari", 100_000, {
        "obs": ((4, 84, 84), np.uint8), "next_obs": ((4, 84, 84), np.uint8),
        "action": ((), np.int64), "reward": ((), np.float32), "done": ((), np.bool_)}),
}

BATCH = 256


def chunks(data: Batch, chunk: int) -> list[Batch]:
    """Pre-cut add arguments: single rows (chunk 1) or ``chunk``-row slices."""
    n = len(next(iter(data.values())))
    if chunk == 1:
        return [{k: v[i] for k, v in data.items()} for i in range(n)]
    return [{k: v[i:i + chunk] for k, v in data.items()} for i in range(0, n - chunk + 1, chunk)]


class System:
    """One buffer implementation under test."""

    name = "?"
    shared = True  # writers in other processes can add to it directly
    chunks = (1, 64)  # rows per add call it supports

    def __init__(self, wl: Workload) -> None:
        self.wl = wl

    def fill(self, data: Batch) -> None:
        """Fill to capacity (sampling is measured on a full buffer)."""
        n = len(next(iter(data.values())))
        step = min(n, 1024)
        add = self.local_adder(step)
        rows = {f: v[:step] for f, v in data.items()}
        for _ in range(self.wl.capacity // step):
            add(rows)

    def writer(self, chunk: int) -> Callable[[Batch], None]:
        """In a forked writer process: a function adding one item of :func:`prepare`."""
        raise NotImplementedError

    def prepare(self, items: list[Batch], chunk: int) -> list[Any]:
        """Convert :func:`chunks` items to what this system's add takes (untimed)."""
        return items

    def local_adder(self, chunk: int) -> Callable[[Batch], None]:
        """The same, in the learner's own process."""
        return self.writer(chunk)

    def sampler(self) -> Callable[[], Any]:
        """In the learner: a function sampling one batch of 256 with the default call (a
        new batch each call, as a user writes it): what every learner figure uses."""
        raise NotImplementedError

    def sampler_out(self) -> Callable[[], Any] | None:
        """The same call filling one preallocated batch (``out=``), or None where the
        system's API has no such form."""
        return None

    def close(self) -> None:
        pass

    def unblock(self) -> None:
        """In the learner, while it waits for its writers' reports: what lets a writer
        blocked on the learner finish its last call (the naive queue drains; a
        rate-limited buffer samples)."""


class ShmbufSystem(System):
    """shmbuf with one lane per writer (``lanes=2``), as the docs recommend for
    several writers: each writer claims its lane by its first add and writes it without
    the lock. ``pure``: the pure-Python path in the learner and the writers."""

    LANES = 2

    def __init__(self, wl: Workload, pure: bool = False, lanes: int = LANES, rate: Any = None,
                 name: str | None = None) -> None:
        super().__init__(wl)
        self.pure, self.LANES = pure, lanes
        self.name = name or ("shmbuf-py" if pure else "shmbuf")
        with _path(pure):
            self.buf = shmbuf.Buffer.create(wl.fields, wl.capacity, lanes=self.LANES, seed=0, rate=rate,
                                            name=f"bench-{os.getpid()}-{wl.name}-{self.name}")
        assert self.buf.native is not pure or not shmbuf.core.native.available()
        self.bytes = self.buf.engine.layout.total_size

    def fill(self, data: Batch) -> None:
        n = len(next(iter(data.values())))
        rows = {f: v[:1024] for f, v in data.items()}
        step = min(n, 1024)
        for i in range(self.wl.capacity // step):  # the lanes in turn, unclaimed (shared)
            self.buf.extend(rows, lane=i % self.LANES)

    def writer(self, chunk: int) -> Callable[[Batch], None]:
        if self.pure:
            os.environ["SHMBUF_PURE_PYTHON"] = "1"  # this writer process only
        if getattr(self, "_mine", (None,))[0] != os.getpid():  # one handle (and lane) a process
            self._mine = (os.getpid(), shmbuf.Buffer.attach(self.buf.name))  # as a real worker would
        buf = self._mine[1]
        return buf.add if chunk == 1 else buf.extend

    def sampler(self) -> Callable[[], Any]:
        sample = self.buf.sample
        return lambda: sample(BATCH)

    def sampler_out(self) -> Callable[[], Any]:
        out = self.buf.empty_batch(BATCH)
        sample = self.buf.sample
        return lambda: sample(BATCH, out=out)

    def close(self) -> None:
        self.buf.close()


class _path:
    """``with _path(pure):`` handles made inside use that path."""

    def __init__(self, pure: bool) -> None:
        self.pure = pure

    def __enter__(self) -> None:
        self.old = os.environ.get("SHMBUF_PURE_PYTHON")
        os.environ["SHMBUF_PURE_PYTHON"] = "1" if self.pure else ""

    def __exit__(self, *exc: object) -> None:
        if self.old is None:
            del os.environ["SHMBUF_PURE_PYTHON"]
        else:
            os.environ["SHMBUF_PURE_PYTHON"] = self.old


class CpprbSystem(System):
    name = "cpprb"

    def __init__(self, wl: Workload, ctx: Any) -> None:
        super().__init__(wl)
        from cpprb import MPReplayBuffer

        env = {k: {"shape": s if s else 1, "dtype": d} for k, (s, d) in wl.fields.items()}
        self.rb = MPReplayBuffer(wl.capacity, env, ctx=ctx)
        self.bytes = wl.row_bytes * wl.capacity

    def writer(self, chunk: int) -> Callable[[Batch], None]:
        add = self.rb.add
        return lambda rows: add(**rows)

    def sampler(self) -> Callable[[], Any]:
        sample = self.rb.sample
        return lambda: sample(BATCH)


class NumpyRing:
    """The in-process ring a user writes with numpy: slices, wrap-around, np.take."""

    def __init__(self, wl: Workload) -> None:
        self.cap = wl.capacity
        self.arrays = {k: np.zeros((wl.capacity,) + s, d) for k, (s, d) in wl.fields.items()}
        self.pos = self.size = 0
        self.rng = np.random.default_rng(0)
        self.out = {k: np.empty((BATCH,) + s, d) for k, (s, d) in wl.fields.items()}

    def add(self, rows: Batch, n: int) -> None:
        """Add ``n`` rows; ``n == 1`` means one row without a row axis."""
        pos, cap = self.pos, self.cap
        if n == 1:
            for k, a in self.arrays.items():
                a[pos] = rows[k]
        else:
            k1 = min(n, cap - pos)
            for k, a in self.arrays.items():
                a[pos:pos + k1] = rows[k][:k1]
                if k1 < n:
                    a[:n - k1] = rows[k][k1:]
        self.pos = (pos + n) % cap
        self.size = min(self.size + n, cap)

    def sample(self) -> Batch:
        """A new batch each call (``np.take`` without ``out=``)."""
        idx = self.rng.integers(0, self.size, BATCH)
        return {k: np.take(a, idx, axis=0, mode="clip") for k, a in self.arrays.items()}

    def sample_out(self) -> Batch:
        """The same into one preallocated batch (``np.take(..., out=)``)."""
        idx = self.rng.integers(0, self.size, BATCH)
        for k, a in self.arrays.items():
            np.take(a, idx, axis=0, out=self.out[k], mode="clip")
        return self.out


class NumpySystem(System):
    """No IPC at all: the learner's own ring (one writer, in-process)."""

    name = "numpy"
    shared = False

    def __init__(self, wl: Workload) -> None:
        super().__init__(wl)
        self.ring = NumpyRing(wl)
        self.bytes = wl.row_bytes * wl.capacity

    def local_adder(self, chunk: int) -> Callable[[Batch], None]:
        add = self.ring.add
        return lambda rows: add(rows, chunk)

    def sampler(self) -> Callable[[], Any]:
        return self.ring.sample

    def sampler_out(self) -> Callable[[], Any]:
        return self.ring.sample_out


class NaiveSystem(System):
    """Writers -> multiprocessing.Queue -> the learner's numpy ring."""

    name = "naive"

    def __init__(self, wl: Workload, ctx: Any) -> None:
        super().__init__(wl)
        self.queue = ctx.Queue(maxsize=64)
        self.ring: NumpyRing | None = None  # set later: the floor's ring (same memory and code)
        self.bytes = wl.row_bytes * wl.capacity

    def fill(self, data: Batch) -> None:
        pass  # the ring is the numpy system's, filled already

    def writer(self, chunk: int) -> Callable[[Batch], None]:
        put = self.queue.put
        return lambda rows: put((rows, chunk))

    def unblock(self) -> None:
        self.drain()

    def drain(self, limit: int = 1_000_000) -> int:
        """Learner side: move whatever has arrived into the ring; returns rows moved."""
        rows = 0
        get, add = self.queue.get_nowait, self.ring.add
        while rows < limit:
            try:
                chunk, n = get()
            except queue_mod.Empty:
                break
            add(chunk, n)
            rows += n
        return rows

    def sampler(self) -> Callable[[], Any]:
        return self.ring.sample

    def flush(self) -> None:
        while True:
            try:
                self.queue.get(timeout=0.2)
            except queue_mod.Empty:
                return


class TorchRLSystem(System):
    """TorchRL's ReplayBuffer(shared=True): storage in shared memory, one mp.Lock."""

    name = "torchrl"

    def __init__(self, wl: Workload) -> None:
        super().__init__(wl)
        import torch
        from torchrl.data import LazyTensorStorage, ReplayBuffer

        torch.set_num_threads(1)  # 2 cores, 3 processes: no intra-op threads
        self.rb = ReplayBuffer(storage=LazyTensorStorage(wl.capacity), shared=True, batch_size=BATCH)
        self.bytes = wl.row_bytes * wl.capacity

    def prepare(self, items: list[Batch], chunk: int) -> list[Any]:
        import torch
        from tensordict import TensorDict

        return [TensorDict({k: torch.from_numpy(np.asarray(v)) for k, v in it.items()},
                           batch_size=[] if chunk == 1 else [chunk]) for it in items]

    def fill(self, data: Batch) -> None:
        n = len(next(iter(data.values())))
        items = self.prepare([data], n)
        for _ in range(self.wl.capacity // n + 1):  # also initialises the shared storage
            self.rb.extend(items[0])

    def writer(self, chunk: int) -> Callable[[Any], None]:
        return self.rb.add if chunk == 1 else self.rb.extend

    def sampler(self) -> Callable[[], Any]:
        return self.rb.sample


class SB3System(System):
    """stable-baselines3's ReplayBuffer (single process; obs and next_obs stored)."""

    name = "sb3"
    shared = False
    chunks = (1,)

    def __init__(self, wl: Workload) -> None:
        super().__init__(wl)
        import torch
        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer

        torch.set_num_threads(1)
        (oshape, odtype), (ashape, adtype) = wl.fields["obs"], wl.fields["action"]
        obs = spaces.Box(0, 255, oshape, np.dtype(odtype)) if np.dtype(odtype) == np.uint8 \
            else spaces.Box(-np.inf, np.inf, oshape, np.dtype(odtype))
        act = spaces.Discrete(18) if np.dtype(adtype).kind == "i" else spaces.Box(-1, 1, ashape, np.dtype(adtype))
        self.rb = ReplayBuffer(wl.capacity, obs, act, device="cpu", n_envs=1)
        self.bytes = wl.row_bytes * wl.capacity

    def prepare(self, items: list[Batch], chunk: int) -> list[Any]:
        return [(it["obs"][None], it["next_obs"][None], np.asarray(it["action"])[None],
                 np.asarray(it["reward"])[None], np.asarray(it["done"])[None], [{}]) for it in items]

    def fill(self, data: Batch) -> None:
        add, items = self.rb.add, self.prepare(chunks(data, 1), 1)
        for i in range(self.wl.capacity):
            add(*items[i % len(items)])

    def local_adder(self, chunk: int) -> Callable[[Any], None]:
        add = self.rb.add
        return lambda item: add(*item)

    def sampler(self) -> Callable[[], Any]:
        return lambda: self.rb.sample(BATCH)
