"""``scripts/bench --ragged``: ragged rollouts (an LLM's RL loop) from two generator
processes to one trainer, through shmbuf's queue with ragged fields, beside
``multiprocessing.Queue`` and ``torch.multiprocessing.Queue`` of the same rollouts and a
raw two-process memcpy of the same bytes through a ``multiprocessing.shared_memory``
block (the floor), in one run.

A rollout: a prompt of 64..1,024 int32 tokens, a response of 1..8,192 int32 tokens with
a float32 logprob and a uint8 mask per token, a float32 reward, an int64 policy version
and its int64 row id (about 39 KB on average; the run prints the measured mean). Every
value is derived from (row id, position), so the trainer checks every token of every
batch, vectorised (:func:`verify`): prompt, response, logprobs, mask, reward, version,
the lengths, and that each generator's rows arrive in order, none lost, none twice.

Two generators (the floor's two writers too: the same work on the same cores) write
rollouts as fast as they can; the trainer takes batches of at most 65,536 response
tokens (a queue's trainer gathers rollouts up to that budget, returning early rather
than waiting once it holds one, as ``take(partial=True)`` does), verifies them, and
after a warm-up reports, over a fixed window, verified response tokens per second and
its own CPU seconds (``getrusage``: user + system) per million tokens.

Each queue is run with each of its batching knobs and the best is the one the targets
use: one rollout a put; a list of 16 rollouts a put; packed (the generator writes
rollouts straight into one batch of <= 65,536 tokens: values + offsets, the trainer's
batch as it is). torch's tensors are allocated in shared memory by the generator
(``share_memory_()``), so a put sends handles only. The floor: each writer memcpys each
rollout into its own ring (one writer, one reader) in a shared-memory block and
publishes a counter; the trainer memcpys a batch out of the rings in turn (one copy per
field and row into fresh arrays) and frees the room (x86 ordering: plain stores, no
fences); the same verification, and once more without it (the copy alone).

The trainer's verification allocates nothing per batch (reused scratch arrays): fresh
temporaries of a batch's size cost page faults that would otherwise dominate every arm.

shmbuf's arm, where this commit has ragged fields: a ``mode="queue"`` buffer, one lane a
generator, each ``extend``-ing lists of rollouts; the trainer
``take(..., max_tokens=65536, length="R", partial=True)`` and verifies the returned
``shmbuf.Jagged`` values and offsets. Also, in this process: ``take(max_tokens=65536)``
against a memcpy of the same bytes, and the segment's bytes per stored payload byte when
the queue is full.

    python -m benchmarks.ragged --quick      # 3 s windows, one round (under a minute)
    python -m benchmarks.ragged              # 10 s windows, 3 rounds, interleaved
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import queue as queue_mod
import resource
import statistics
import struct
import sys
import time
from multiprocessing import shared_memory
from typing import Any, Callable

import numpy as np

import shmbuf

BUDGET = 65_536  # response tokens a batch holds at most
GENERATORS = 2
PROMPT, RESPONSE = (64, 1024), (1, 8192)
LIST = 16  # rollouts a put, the list knob (about one batch's tokens)
CTX = mp.get_context("fork")  # (the parent never runs torch before forking: it only imports it)
TIMEOUT = 30.0  # seconds any wait of the trainer's may take before the arm is declared stuck

Batch = dict[str, np.ndarray]
"""row, version, reward (n,); prompt, response, logprobs, mask: values; prompt_offsets,
response_offsets: (n + 1,) int64 (logprobs and mask share the response's)."""

_AR = np.arange(1 << 20, dtype=np.int32)
MASK = (np.arange(RESPONSE[1]) & 1).astype(np.uint8)
LOGPROB = np.int32(-0x40800000)  # logprob bits = response + this: a float32 in [-2, -1)


def _ar(n: int) -> np.ndarray:
    global _AR
    if n > len(_AR):
        _AR = np.arange(max(n, 2 * len(_AR)), dtype=np.int32)
    return _AR[:n]


# -- the rollouts: every value from (row id, position) ------------------------------------

def lengths(rows: Any) -> tuple[Any, Any]:
    """(prompt length, response length) of each row id (a hash: any row, no table)."""
    h = (np.asarray(rows, np.int64) * 2654435761) & 0xFFFFFFFF
    return PROMPT[0] + (h >> 13) % (PROMPT[1] - PROMPT[0] + 1), RESPONSE[0] + h % RESPONSE[1]


def _lengths(row: int) -> tuple[int, int]:
    """:func:`lengths` of one row id, in Python integers (a generator's, per rollout)."""
    h = (row * 2654435761) & 0xFFFFFFFF
    return PROMPT[0] + (h >> 13) % (PROMPT[1] - PROMPT[0] + 1), RESPONSE[0] + h % RESPONSE[1]


def _key(rows: Any) -> Any:
    return (rows % 1024) * 8192  # (< 2**23; the lengths and the row field tell rows 1024 apart)


def fill(row: int, prompt: np.ndarray, response: np.ndarray, logprobs: np.ndarray, mask: np.ndarray) -> None:
    """Write row ``row``'s values into arrays of its lengths: prompt[i] = key + 8191 - i,
    response[i] = key + i, the bits of logprobs[i] = response[i] + LOGPROB (a float32 in
    [-2, -1)), mask[i] = i & 1; key = (row % 1024) * 8192. Cheap to write and to check:
    each value is one add away from its position or its response token."""
    key = _key(row)
    np.subtract(key + 8191, _ar(len(prompt)), out=prompt)
    n = len(response)
    np.add(_ar(n), key, out=response)
    np.add(response, LOGPROB, out=logprobs.view(np.int32))
    mask[:] = MASK[:n]


def rollout(row: int) -> dict[str, Any]:
    """One rollout as fresh numpy arrays (a generator's output)."""
    pl, rl = _lengths(row)
    r = {"row": row, "version": row >> 10, "reward": np.float32(row % 1000),
         "prompt": np.empty(pl, np.int32), "response": np.empty(rl, np.int32),
         "logprobs": np.empty(rl, np.float32), "mask": np.empty(rl, np.uint8)}
    fill(row, r["prompt"], r["response"], r["logprobs"], r["mask"])
    return r


def payload_bytes(rows: Any) -> Any:
    """Bytes of each row's values: the tokens, reward, version and row id."""
    pl, rl = lengths(rows)
    return pl * 4 + rl * 9 + 4 + 8 + 8


class Mismatch(AssertionError):
    """A batch that does not hold what the generators wrote."""


_SCRATCH: list[np.ndarray] = [np.empty(0, np.int32), np.empty(0, np.bool_)]


def _scratch(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Arrays of ``n`` int32 and ``n`` bools, reused: verification allocates nothing per
    batch (fresh temporaries of this size cost page faults, which would then dominate)."""
    if len(_SCRATCH[0]) < n:
        _SCRATCH[:] = [np.empty(2 * n, np.int32), np.empty(2 * n, np.bool_)]
    return _SCRATCH[0][:n], _SCRATCH[1][:n]


def _steps(d: np.ndarray, starts: np.ndarray, want: np.ndarray, ok: np.ndarray) -> bool:
    """Whether ``d`` is ``want[i]`` all along row ``i`` (rows begin at ``starts``)."""
    if not np.array_equal(d[starts], want):
        return False
    changed = np.not_equal(d[1:], d[:-1], out=ok[:len(d) - 1])
    changed[starts[1:] - 1] = False  # (where a row begins)
    return not changed.any()


def verify(b: Batch, due: list[int] | None, generators: int, versions: tuple[int, int] | None = None,
           gaps: bool = False) -> int:
    """Check every value of batch ``b``; ``due[g]``: the next row generator ``g`` owes
    (updated; None: rows may come in any order, or more than once: a replay buffer's
    sample). ``versions``: (lowest, highest) a row's version may be (None: ``row >> 10``);
    ``gaps``: a generator's rows may skip rows (passed over as stale), still in order,
    none twice. Returns the batch's response tokens; raises :class:`Mismatch`."""
    rows = np.asarray(b["row"], np.int64)
    n = len(rows)
    if n == 0:
        raise Mismatch("an empty batch")
    gen = rows % generators
    for g in range(generators if due is not None else 0):
        mine = rows[gen == g]
        if len(mine):
            if gaps:
                if mine[0] < due[g] or (len(mine) > 1 and not (np.diff(mine) > 0).all()):
                    raise Mismatch(f"generator {g}: rows {mine[:4].tolist()}... out of order, or again "
                                   f"(row {due[g]} or later was due)")
                due[g] = int(mine[-1]) + generators
                continue
            want = due[g] + generators * np.arange(len(mine))
            if not np.array_equal(mine, want):
                raise Mismatch(f"generator {g}: rows {mine[:4].tolist()}... where {want[:4].tolist()}... were due")
            due[g] = int(want[-1]) + generators
    pl, rl = lengths(rows)
    po, ro = np.asarray(b["prompt_offsets"]), np.asarray(b["response_offsets"])
    if len(po) != n + 1 or len(ro) != n + 1 or po[0] != 0 or ro[0] != 0 \
            or not np.array_equal(np.diff(po), pl) or not np.array_equal(np.diff(ro), rl):
        raise Mismatch(f"lengths or offsets differ from the rows' (rows {rows[:4].tolist()}...)")
    total, ptotal = int(ro[-1]), int(po[-1])
    response, logprobs, mask, prompt = b["response"], b["logprobs"], b["mask"], b["prompt"]
    if not (len(response) == len(logprobs) == len(mask) == total and len(prompt) == ptotal):
        raise Mismatch("values longer or shorter than the offsets say")
    key = _key(rows).astype(np.int32)
    starts, pstarts = ro[:-1], po[:-1]
    s, ok = _scratch(max(total, ptotal))
    s, ok = s[:total], ok[:total]
    if not _steps(np.subtract(response, _ar(total), out=s), starts, key - starts, ok):  # response[i] - i == key
        raise Mismatch("a response token differs")
    if not np.equal(np.subtract(logprobs.view(np.int32), response, out=s), LOGPROB, out=ok).all():
        raise Mismatch("a logprob differs")
    if not np.equal(np.bitwise_and(response, 1, out=s), mask, out=ok).all():  # (key is even: i & 1)
        raise Mismatch("a mask value differs")
    s, ok = _scratch(ptotal)
    if not _steps(np.add(prompt, _ar(ptotal), out=s[:ptotal]), pstarts, key + 8191 + pstarts, ok):
        raise Mismatch("a prompt token differs")
    version = np.asarray(b["version"])
    if not np.array_equal(b["reward"], (rows % 1000).astype(np.float32)):
        raise Mismatch("a reward differs")
    if not (np.array_equal(version, rows >> 10) if versions is None
            else ((version >= versions[0]) & (version <= versions[1])).all()):
        raise Mismatch(f"a version differs (or lies outside {versions}): {version[:4].tolist()}...")
    return total


def _offsets(lens: list[int]) -> np.ndarray:
    out = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=out[1:])
    return out


def collate(items: list[dict[str, Any]]) -> Batch:
    """Rollouts -> one batch (what a trainer of a queue does: one copy of each value)."""
    cat = lambda k: np.concatenate([np.asarray(it[k]) for it in items])  # noqa: E731
    extra = {k: [it[k] for it in items] for k in items[0] if k not in _COLLATED}  # (e.g. a time, an infos dict)
    return {**extra, "row": np.array([it["row"] for it in items], np.int64),
            "version": np.array([it["version"] for it in items], np.int64),
            "reward": np.array([it["reward"] for it in items], np.float32),
            "prompt": cat("prompt"), "prompt_offsets": _offsets([len(it["prompt"]) for it in items]),
            "response": cat("response"), "response_offsets": _offsets([len(it["response"]) for it in items]),
            "logprobs": cat("logprobs"), "mask": cat("mask")}


_COLLATED = {"row", "version", "reward", "prompt", "response", "logprobs", "mask"}


def packed_rows(first: int, step: int) -> tuple[list[int], int]:
    """Rows ``first``, ``first + step``, ... up to the budget: (rows, the next row)."""
    rows, tokens, row = [], 0, first
    while True:
        rl = _lengths(row)[1]
        if rows and tokens + rl > BUDGET:
            return rows, row
        rows.append(row)
        tokens += rl
        row += step


def pack(rows: list[int], alloc: Callable[[int, Any], Any], view: Callable[[Any], np.ndarray]) -> dict[str, Any]:
    """One batch of ``rows`` written in place into arrays from ``alloc(n, dtype)``
    (``view`` gives the numpy array of one): the generator's side of the packed knob."""
    pl, rl = lengths(np.array(rows, np.int64))
    po, ro = _offsets(pl.tolist()), _offsets(rl.tolist())
    out = {"prompt": alloc(int(po[-1]), np.int32), "response": alloc(int(ro[-1]), np.int32),
           "logprobs": alloc(int(ro[-1]), np.float32), "mask": alloc(int(ro[-1]), np.uint8)}
    p, r, lp, m = (view(out[k]) for k in ("prompt", "response", "logprobs", "mask"))
    for i, row in enumerate(rows):
        fill(row, p[po[i]:po[i + 1]], r[ro[i]:ro[i + 1]], lp[ro[i]:ro[i + 1]], m[ro[i]:ro[i + 1]])
    ids = np.array(rows, np.int64)
    return {**out, "row": ids, "version": ids >> 10, "reward": (ids % 1000).astype(np.float32),
            "prompt_offsets": po, "response_offsets": ro}


# -- the arms ---------------------------------------------------------------------------

class Arm:
    """One system with one knob: its transport, its generators' loop, its trainer's
    next batch. Built in the parent; generators and trainer are forked children."""

    name = "?"
    generators = GENERATORS
    forks = GENERATORS  # generator processes forked by run_arm (0: the trainer starts its own)
    startup = 0.0  # seconds the trainer may take to start, beyond the usual
    verified = True

    def open(self) -> None:
        """In the parent, before the fork: the transport."""

    def stop_event(self) -> Any:
        """What tells the generators to stop (``is_set()``)."""
        return CTX.Event()

    def meta(self, row: int) -> dict[str, Any]:
        """A rollout's fixed fields besides its row id and reward, as a generator stamps them."""
        return {"version": row >> 10}

    def keep(self, item: dict[str, Any]) -> bool:
        """Whether the trainer keeps a rollout it got (False: dropped, e.g. as stale)."""
        return True

    def check(self, b: Batch, due: list[int]) -> int:
        """The trainer's verification of batch ``b``: its response tokens."""
        return verify(b, due, self.generators) if self.verified else int(b["response_offsets"][-1])

    def after(self, b: Batch) -> None:
        """The trainer's use of a verified batch (its update)."""

    def measure(self) -> None:
        """The trainer's window begins (after the warm-up)."""

    def report(self) -> dict[str, Any]:
        """The trainer's figures of its own, beside the common ones."""
        return {}

    def generate(self, g: int, stop: Any) -> None:
        raise NotImplementedError

    def batches(self) -> Callable[[], Batch]:
        """In the trainer: a function returning the next batch."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class QueueArm(Arm):
    """``multiprocessing.Queue`` (``torch``: ``torch.multiprocessing.Queue``, tensors in
    shared memory) with one knob: ``"one"`` rollout a put, a ``"list"`` of 16, or
    ``"packed"`` batches."""

    KNOBS = {"one": "1 rollout a put", "list": f"a list of {LIST} rollouts a put",
             "packed": f"packed: one batch (<= {BUDGET:,} tokens) a put"}

    def __init__(self, knob: str, torch: bool = False) -> None:
        self.knob, self.torch = knob, torch
        self.system = "torch.multiprocessing.Queue" if torch else "multiprocessing.Queue"
        self.name = f"{self.system}, {self.KNOBS[knob]}"

    def open(self) -> None:
        ctx = CTX
        if self.torch:
            import torch.multiprocessing as tmp  # (imported only: nothing runs before the fork)
            ctx = tmp.get_context("fork")
        self.q = ctx.Queue({"one": 64, "list": 4, "packed": 4}[self.knob])

    def _tensors(self) -> tuple[Callable[[int, Any], Any], Callable[[Any], np.ndarray]]:
        if not self.torch:
            return (lambda n, dt: np.empty(n, dt)), (lambda a: a)
        import torch
        torch.set_num_threads(1)
        dtypes = {np.dtype(np.int32): torch.int32, np.dtype(np.float32): torch.float32,
                  np.dtype(np.uint8): torch.uint8}
        return (lambda n, dt: torch.empty(n, dtype=dtypes[np.dtype(dt)]).share_memory_()), (lambda t: t.numpy())

    def _one(self, row: int, alloc: Callable[[int, Any], Any], view: Callable[[Any], np.ndarray]) -> dict[str, Any]:
        pl, rl = _lengths(row)
        r = {"prompt": alloc(pl, np.int32), "response": alloc(rl, np.int32),
             "logprobs": alloc(rl, np.float32), "mask": alloc(rl, np.uint8)}
        fill(row, *(view(r[k]) for k in ("prompt", "response", "logprobs", "mask")))
        return {**r, **self.meta(row), "row": row, "reward": np.float32(row % 1000)}

    def generate(self, g: int, stop: Any) -> None:
        if hasattr(self.q, "cancel_join_thread"):
            self.q.cancel_join_thread()  # (exit at once at the end, whatever is still in the pipe)
        alloc, view = self._tensors()
        row, step = g, self.generators
        while not stop.is_set():
            if self.knob == "one":
                item, nxt = self._one(row, alloc, view), row + step
            elif self.knob == "list":
                item, nxt = [self._one(row + step * i, alloc, view) for i in range(LIST)], row + step * LIST
            else:
                rows, nxt = packed_rows(row, step)
                item = pack(rows, alloc, view)
            while not stop.is_set():
                try:
                    self.q.put(item, timeout=0.2)
                    row = nxt
                    break
                except queue_mod.Full:
                    continue

    def batches(self) -> Callable[[], Batch]:
        if self.torch:
            import torch
            torch.set_num_threads(1)
        get, knob, q = self.q.get, self.knob, self.q
        if knob == "packed":
            def packed() -> Batch:
                b = get(timeout=TIMEOUT)
                return {k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()}
            return packed
        pending: collections.deque = collections.deque()

        def numpy(it: dict[str, Any]) -> dict[str, Any]:
            return {k: v.numpy() if hasattr(v, "numpy") else v for k, v in it.items()}

        def gathered() -> Batch:
            items: list[dict[str, Any]] = []
            tokens = 0
            while True:
                if not pending:
                    try:
                        got = get(timeout=TIMEOUT) if not items else q.get_nowait()
                    except queue_mod.Empty:
                        if items:
                            break  # (partial: what there is)
                        raise
                    pending.extend(got if knob == "list" else [got])
                if not self.keep(pending[0]):
                    pending.popleft()
                    continue
                n = len(pending[0]["response"])
                if items and tokens + n > BUDGET:
                    break
                items.append(numpy(pending.popleft()))
                tokens += n
            return collate(items)
        return gathered

    def close(self) -> None:
        self.q.close()


HEAD = struct.Struct("<qqqqf")  # row (-1: skip to the ring's start), prompt length, response length, version, reward
RECORD_HEAD = 64
CTRL = 128  # a ring's counters: [0] head (bytes published), [64] tail (bytes freed): own cache lines


def _record(pl: int, rl: int) -> int:
    return RECORD_HEAD + (pl * 4 + rl * 9 + 63) // 64 * 64


class FloorArm(Arm):
    """A raw memcpy of the same bytes between processes: each generator memcpys its
    rollouts into its own ring (one writer, one reader: a counter each way, no lock) in
    one shared-memory block; the trainer memcpys batches out of the rings in turn.
    ``verified=False``: the copy alone."""

    RING = 32 << 20  # bytes a ring

    def __init__(self, verified: bool = True) -> None:
        self.verified = verified
        self.name = (f"memcpy floor: {self.generators} writers, a ring each, the same verification" if verified
                     else f"memcpy floor: {self.generators} writers, copy only (no verification)")

    def open(self) -> None:
        self.shm = shared_memory.SharedMemory(create=True, size=self.generators * (CTRL + self.RING))

    def _views(self, g: int) -> tuple[np.ndarray, np.ndarray, Any, int]:
        """Ring ``g``: (counters, bytes, the block's buffer, the bytes' offset in it)."""
        at = g * (CTRL + self.RING)
        buf = self.shm.buf
        return (np.ndarray((CTRL // 8,), np.int64, buf, at), np.ndarray((self.RING,), np.uint8, buf, at + CTRL),
                buf, at + CTRL)

    def generate(self, g: int, stop: Any) -> None:
        ctrl, ring, buf, base = self._views(g)
        head, row, step, ring_size = 0, g, self.generators, self.RING
        while not stop.is_set():
            r = rollout(row)
            pl, rl = len(r["prompt"]), len(r["response"])
            size = _record(pl, rl)
            pos = head % ring_size
            skip = ring_size - pos if pos + size > ring_size else 0
            while head + skip + size - int(ctrl[8]) > ring_size:  # wait for room
                if stop.is_set():
                    return
                time.sleep(20e-6)
            if skip:
                HEAD.pack_into(buf, base + pos, -1, skip, 0, 0, 0.0)
                head += skip
                pos = 0
            HEAD.pack_into(buf, base + pos, row, pl, rl, r["version"], float(r["reward"]))
            at = pos + RECORD_HEAD
            for k in ("prompt", "response", "logprobs", "mask"):
                v = r[k].view(np.uint8)
                ring[at:at + len(v)] = v  # memcpy
                at += len(v)
            head += size
            ctrl[0] = head  # publish (x86: stores are not reordered with stores)
            row += step

    def batches(self) -> Callable[[], Batch]:
        rings = [self._views(g) for g in range(self.generators)]
        tails = [0] * self.generators
        turn = [0]
        ring_size = self.RING

        def scan(g: int, recs: list[tuple], tokens: int) -> int:
            """Records of ring ``g`` published and within the budget, onto ``recs``."""
            ctrl, ring, buf, base = rings[g]
            head, pos = int(ctrl[0]), tails[g]
            while pos < head:
                p = pos % ring_size
                row, pl, rl, version, reward = HEAD.unpack_from(buf, base + p)
                if row == -1:
                    pos += pl
                    continue
                if recs and tokens + rl > BUDGET:
                    break
                recs.append((g, p, row, pl, rl, version, reward))
                tokens += rl
                pos += _record(pl, rl)
            tails[g] = pos  # (freed below, once copied)
            return tokens

        def batch() -> Batch:
            recs: list[tuple] = []
            deadline = time.monotonic() + TIMEOUT
            while True:
                tokens = 0
                for i in range(self.generators):
                    tokens = scan((turn[0] + i) % self.generators, recs, tokens)
                if recs:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the floor's writers published nothing")
                time.sleep(20e-6)
            turn[0] = (turn[0] + 1) % self.generators
            po, ro = _offsets([r[3] for r in recs]), _offsets([r[4] for r in recs])
            out = {"prompt": np.empty(po[-1], np.int32), "response": np.empty(ro[-1], np.int32),
                   "logprobs": np.empty(ro[-1], np.float32), "mask": np.empty(ro[-1], np.uint8)}
            dst = {k: v.view(np.uint8) for k, v in out.items()}
            for i, (g, p, row, pl, rl, version, reward) in enumerate(recs):
                ring, at = rings[g][1], p + RECORD_HEAD
                for k, off, size in (("prompt", 4 * po[i], 4 * pl), ("response", 4 * ro[i], 4 * rl),
                                     ("logprobs", 4 * ro[i], 4 * rl), ("mask", ro[i], rl)):
                    dst[k][off:off + size] = ring[at:at + size]  # memcpy
                    at += size
            for g, (ctrl, _, _, _) in enumerate(rings):
                ctrl[8] = tails[g]  # free the room (after the copies)
            return {**out, "row": np.array([r[2] for r in recs], np.int64),
                    "version": np.array([r[5] for r in recs], np.int64),
                    "reward": np.array([r[6] for r in recs], np.float32),
                    "prompt_offsets": po, "response_offsets": ro}
        return batch

    def close(self) -> None:
        self.shm.close()
        self.shm.unlink()


RAGGED_FIELDS = {"prompt": ((None,), np.int32), "response": (("R",), np.int32), "logprobs": (("R",), np.float32),
                 "mask": (("R",), np.uint8), "reward": ((), np.float32), "version": ((), np.int64),
                 "row": ((), np.int64)}


def extend_args(rows: Any) -> dict[str, Any]:
    """``Buffer.extend``'s argument for the rollouts of ``rows``: a list of arrays a
    ragged field, an array a fixed one."""
    items = [rollout(r) for r in rows]
    batch: dict[str, Any] = {k: [it[k] for it in items] for k in ("prompt", "response", "logprobs", "mask")}
    ids = np.array([it["row"] for it in items], np.int64)
    return {**batch, "row": ids, "version": ids >> 10, "reward": (ids % 1000).astype(np.float32)}


class ShmbufArm(Arm):
    """shmbuf's queue with ragged fields: a lane a generator, ``extend`` of ``per``
    rollouts; the trainer ``take(max_tokens=BUDGET, length="R", partial=True)``."""

    CAPACITY = 1024  # rows at most: more than the arena holds, so bytes, not rows, fill the queue
    ARENA = 24 << 20  # bytes of ragged values, all lanes: ~640 rollouts of ~39 KB in flight

    def __init__(self, per: int = LIST) -> None:
        self.per = per
        self.name = (f"shmbuf queue, extend of {per} rollout{'s' * (per > 1)}; take(max_tokens={BUDGET:,}, "
                     "partial=True)")

    @staticmethod
    def create(capacity: int, arena: int, lanes: int, fields: Any = RAGGED_FIELDS, **kw: Any) -> Any:
        return shmbuf.Buffer.create(fields, capacity, lanes=lanes, mode="queue", arena=arena, **kw)

    def open(self) -> None:
        self.buf = self.create(self.CAPACITY, self.ARENA, self.generators)

    def extend(self, rows: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """``extend``'s rows and keywords for the rollouts ``rows``."""
        return extend_args(rows), {}

    def take_args(self) -> dict[str, Any]:
        """``take``'s keywords beside the token budget."""
        return {}

    def generate(self, g: int, stop: Any) -> None:
        q = shmbuf.Buffer.attach(self.buf.name)
        row, step = g, self.generators
        while not stop.is_set():
            batch, kw = self.extend(range(row, row + step * self.per, step))
            while not stop.is_set():
                try:
                    q.extend(batch, timeout=0.2, **kw)  # (a refused extend writes nothing: retried whole)
                    row += step * self.per
                    break
                except (shmbuf.WriteTimeout, shmbuf.LockTimeout):  # (full; or the machine overloaded)
                    continue

    def batches(self) -> Callable[[], Batch]:
        q = shmbuf.Buffer.attach(self.buf.name)
        take, n = q.take, self.CAPACITY

        def batch() -> Batch:
            b = take(n, partial=True, max_tokens=BUDGET, length="R", timeout=TIMEOUT, **self.take_args())
            p, r = b["prompt"], b["response"]
            return {**b, "prompt": p.values, "prompt_offsets": p.offsets, "response": r.values,
                    "response_offsets": r.offsets, "logprobs": b["logprobs"].values, "mask": b["mask"].values}
        return batch

    def close(self) -> None:
        self.buf.close()


def ragged_unavailable() -> str | None:
    """Why this commit's shmbuf cannot run the shmbuf arm (None: it can)."""
    try:
        buf = ShmbufArm.create(16, 1 << 20, 1)
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    buf.close()
    return None


# -- running an arm ---------------------------------------------------------------------

def _trainer(arm: Arm, conn: Any, warmup: float, seconds: float) -> None:
    try:
        nxt = arm.batches()
        due = list(range(arm.generators))
        tokens = rows = batches = 0
        end = time.perf_counter() + warmup
        while time.perf_counter() < end:
            b = nxt()
            arm.check(b, due)
            arm.after(b)
        arm.measure()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        waited, t0 = 0.0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            w = time.perf_counter()
            b = nxt()
            waited += time.perf_counter() - w
            tokens += arm.check(b, due)
            arm.after(b)
            rows += len(b["row"])
            batches += 1
        elapsed = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        conn.send({"tokens/s": tokens / elapsed, "rows/s": rows / elapsed, "batches": batches,
                   "tokens per batch": tokens / max(batches, 1), "cpu s per M tokens": cpu / tokens * 1e6,
                   "in get/take": waited / elapsed, "seconds": elapsed, **arm.report()})
    except BaseException as e:  # (the parent reports it)
        conn.send({"error": f"{type(e).__name__}: {e}"})


def _generator(arm: Arm, g: int, stop: Any) -> None:
    try:
        arm.generate(g, stop)
    except KeyboardInterrupt:
        pass


def run_arm(arm: Arm, warmup: float, seconds: float) -> dict[str, Any]:
    """Fork the generators and the trainer of ``arm``; their trainer's figures."""
    arm.open()
    stop = arm.stop_event()
    mine, theirs = CTX.Pipe()
    procs = [CTX.Process(target=_generator, args=(arm, g, stop), daemon=True) for g in range(arm.forks)]
    procs.append(CTX.Process(target=_trainer, args=(arm, theirs, warmup, seconds), daemon=True))
    try:
        for p in procs:
            p.start()
        if not mine.poll(warmup + seconds + 2 * TIMEOUT + arm.startup):
            return {"error": "the trainer did not report in time"}
        return mine.recv()
    finally:
        stop.set()
        end = time.monotonic() + 10
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)
        arm.close()


# -- shmbuf in this process -----------------------------------------------------------------

def _fill_queue(q: Any, first: int, extends: list[tuple[float, int]]) -> int:
    """Extend :data:`LIST` rollouts at a time until the queue refuses more; each
    extend's (seconds, payload bytes) onto ``extends``. Returns the rows written."""
    row = first
    while True:
        batch = extend_args(range(row, row + LIST))
        t0 = time.perf_counter()
        try:
            q.extend(batch, timeout=0.05)
        except shmbuf.WriteTimeout:
            break
        extends.append((time.perf_counter() - t0, int(payload_bytes(batch["row"]).sum())))
        row += LIST
    if row == first:
        raise RuntimeError("the queue took no rollout")
    return row - first


def _memcpy_s(src: np.ndarray, size: int, at: int, into: np.ndarray | None = None) -> float:
    """Seconds to copy ``size`` bytes of ``src`` into a fresh array (as take's output is;
    its first touch of fresh pages included), or into ``into`` (reused: the copy alone)."""
    at %= len(src) - size
    t0 = time.perf_counter()
    out = np.empty(size, np.uint8) if into is None else into[:size]
    np.copyto(out, src[at:at + size])
    return time.perf_counter() - t0


def in_process(takes: int) -> dict[str, Any]:
    """``take(max_tokens=BUDGET)`` against a memcpy of the same bytes (medians), the
    same for ``extend`` of :data:`LIST` rollouts, and the segment's bytes per payload
    byte of a full queue."""
    q = ShmbufArm.create(ShmbufArm.CAPACITY, ShmbufArm.ARENA, 1)
    try:
        extends: list[tuple[float, int]] = []
        stored = _fill_queue(q, 0, extends)
        payload = int(payload_bytes(np.arange(stored)).sum())
        segment = q.engine.layout.total_size
        src = np.random.default_rng(0).integers(0, 255, 64 << 20, np.uint8)
        take_s, copy_s, warm_s, nbytes, row, due = [], [], [], [], stored, [0]
        reused = np.zeros(4 << 20, np.uint8)
        for i in range(takes):
            if len(q) == 0:
                row += _fill_queue(q, row, extends)
            t0 = time.perf_counter()
            b = q.take(ShmbufArm.CAPACITY, partial=True, max_tokens=BUDGET, length="R", timeout=TIMEOUT)
            take_s.append(time.perf_counter() - t0)
            batch = {"row": b["row"], "version": b["version"], "reward": b["reward"],
                     "prompt": b["prompt"].values, "prompt_offsets": b["prompt"].offsets,
                     "response": b["response"].values, "response_offsets": b["response"].offsets,
                     "logprobs": b["logprobs"].values, "mask": b["mask"].values}
            verify(batch, due, 1)
            size = sum(v.nbytes for v in batch.values())  # (values, offsets and the fixed fields)
            nbytes.append(size)
            copy_s.append(_memcpy_s(src, size, i << 20))
            warm_s.append(_memcpy_s(src, size, i << 20, reused))
        reuse_s, b = [], None  # the hot loop's take(out=): the batch before given back
        for i in range(takes):
            if len(q) == 0:
                row += _fill_queue(q, row, extends)
            t0 = time.perf_counter()
            b = q.take(ShmbufArm.CAPACITY, partial=True, max_tokens=BUDGET, length="R", timeout=TIMEOUT, out=b)
            reuse_s.append(time.perf_counter() - t0)
        ext_copy = [_memcpy_s(src, size, i << 20) for i, (_, size) in enumerate(extends)]
        med = statistics.median
        return {"rows stored when full": stored, "payload bytes": payload, "segment bytes": segment,
                "segment / payload": segment / payload, "takes": takes,
                "take s": med(take_s), "memcpy s": med(copy_s), "batch bytes": med(nbytes),
                "take / memcpy": med(t / c for t, c in zip(take_s, copy_s)),
                "memcpy reused s": med(warm_s), "take / memcpy reused": med(t / c for t, c in zip(take_s, warm_s)),
                "take out= s": med(reuse_s), "take out= / memcpy reused": med(reuse_s) / med(warm_s),
                "extends": len(extends), "extend s": med(t for t, _ in extends),
                "extend bytes": med(n for _, n in extends),
                "extend / memcpy": med(t / c for (t, _), c in zip(extends, ext_copy))}
    finally:
        q.close()


# -- the run and its report ----------------------------------------------------------------------

def arms(torch: bool) -> list[Arm]:
    out: list[Arm] = [QueueArm(k) for k in QueueArm.KNOBS]
    if torch:
        out += [QueueArm(k, torch=True) for k in QueueArm.KNOBS]
    return out + [FloorArm(True), FloorArm(False)]


def _torch() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def run(quick: bool = False, window: float | None = None, rounds: int | None = None,
        progress: bool = True) -> dict[str, Any]:
    from benchmarks.run import machine

    seconds = window if window is not None else (3.0 if quick else 10.0)
    rounds = rounds if rounds is not None else (1 if quick else 3)
    warmup = min(1.0, seconds / 3)
    torch = _torch()
    why = ragged_unavailable()
    systems = arms(torch) + ([] if why else [ShmbufArm(1), ShmbufArm(LIST)])
    ids = np.arange(1_000_000)
    res: dict[str, Any] = {
        "kind": "ragged", "machine": machine(), "config": {"quick": quick, "window s": seconds, "rounds": rounds,
                                                           "warmup s": warmup, "budget tokens": BUDGET},
        "rows": {"mean bytes": float(payload_bytes(ids).mean()), "mean prompt tokens": float(lengths(ids)[0].mean()),
                 "mean response tokens": float(lengths(ids)[1].mean())},
        "torch": torch, "shmbuf unavailable": why, "arms": {a.name: [] for a in systems}}
    for rnd in range(rounds):  # interleaved: drift hits every arm alike
        for a in systems:
            if progress:
                print(f"\r\033[K  ragged round {rnd + 1}/{rounds}: {a.name}", end="", file=sys.stderr, flush=True)
            res["arms"][a.name].append(run_arm(a, warmup, seconds))
    if not why:
        if progress:
            print("\r\033[K  ragged: take vs memcpy, memory per token", end="", file=sys.stderr, flush=True)
        res["in process"] = in_process(50 if quick else 300)
    if progress:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    return res


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in runs if "error" not in r]
    return statistics.median(vals) if vals else None


def summary(res: dict[str, Any]) -> dict[str, Any]:
    """The best queue (each by the better of the issue's knobs: one rollout or a list a
    put), the floor, shmbuf, and the target ratios."""
    rate = {name: _median(runs, "tokens/s") for name, runs in res["arms"].items()}
    best: dict[str, str] = {}
    for name, v in rate.items():
        if v is not None and "Queue" in name and "packed" not in name:
            system = name.split(",")[0]
            if system not in best or v > rate[best[system]]:
                best[system] = name
    queue = max(best.values(), key=lambda n: rate[n], default=None)
    packed = max((n for n, v in rate.items() if v is not None and "packed" in n), key=lambda n: rate[n], default=None)
    floor = next((n for n in rate if n.startswith("memcpy floor") and "verification" in n and "no " not in n), None)
    shm = max((n for n, v in rate.items() if v is not None and n.startswith("shmbuf")), key=lambda n: rate[n],
              default=None)
    s = rate.get(shm) if shm else None
    qv, pv, fv = (rate.get(n) if n else None for n in (queue, packed, floor))
    ip = res.get("in process", {})
    targets = [
        ("shmbuf / the best queue (verified tokens/s)", s / qv if s and qv else None, ">= 3", 3, True),
        ("shmbuf / the memcpy floor (verified tokens/s)", s / fv if s and fv else None, ">= 0.6", 0.6, True),
        (f"take(max_tokens={BUDGET:,}) / a memcpy of its bytes into a fresh array (time)", ip.get("take / memcpy"), "<= 1.5", 1.5, False),
        ("shared memory per stored token / its payload (full queue)", ip.get("segment / payload"), "<= 1.1", 1.1,
         False),
        ("(no target) shmbuf / the best packed queue", s / pv if s and pv else None, "-", None, True)]
    return {"rate": rate, "best knob": best, "best queue": queue, "packed": packed, "floor": floor, "shmbuf": shm,
            "targets": targets}


def markdown(res: dict[str, Any]) -> str:
    m, c, rows = res["machine"], res["config"], res["rows"]
    sm = summary(res)
    rate = sm["rate"]
    qv = rate.get(sm["best queue"]) if sm["best queue"] else None
    fv = rate.get(sm["floor"]) if sm["floor"] else None
    lines = [f"### Ragged rollouts: {GENERATORS} generators -> 1 trainer, batches of <= {BUDGET:,} response tokens",
             "",
             f"{'quick' if c['quick'] else 'full'}: {c['rounds']} round(s) of {c['window s']:g} s windows (after "
             f"{c['warmup s']:g} s of warm-up), arms interleaved; {m['cpus']} cores, Python {m['python']}, numpy "
             f"{m['numpy']}, torch {m['torch'] or 'not installed'}, shmbuf {m['shmbuf']}, {m['date']}. A row: prompt "
             f"{rows['mean prompt tokens']:,.0f} tokens, response {rows['mean response tokens']:,.0f} tokens on "
             f"average: {rows['mean bytes'] / 1e3:,.1f} KB measured (int32 tokens, float32 logprobs, uint8 mask, "
             "reward, version, row id). Tokens: response tokens, every one verified (and the prompt's) unless "
             "the row says not. CPU: the trainer's (user + system); in get/take: the share of the window "
             "spent getting batches (waiting for rollouts, and copying them).",
             "",
             "| system, knob | verified tokens/s | GB/s | / best queue | / floor | trainer CPU s per M tokens "
             "| trainer in get/take |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, runs in res["arms"].items():
        err = next((r["error"] for r in runs if "error" in r), None)
        v = rate.get(name)
        if v is None:
            lines.append(f"| {name} | **failed**: {err} | | | | | |")
            continue
        cpu, wait = _median(runs, "cpu s per M tokens"), _median(runs, "in get/take")
        gbs = v * rows["mean bytes"] / rows["mean response tokens"] / 1e9
        mark = " **(best knob)**" if name in sm["best knob"].values() or name == sm["shmbuf"] else ""
        ratio = lambda base: f"{v / base:.2f}" if base else "-"  # noqa: E731
        lines.append(f"| {name}{mark} | {v / 1e6:,.1f} M | {gbs:.2f} | {ratio(qv)} | {ratio(fv)} | "
                     f"{cpu:.3f} | {100 * wait:.0f}% |")
        if err:
            lines.append(f"| ({name}: a round failed: {err}) | | | | | | |")
    if not res["torch"]:
        lines.append("| torch.multiprocessing.Queue | torch not installed | | | | | |")
    if res["shmbuf unavailable"]:
        lines.append(f"| shmbuf queue | shmbuf ragged: not available on this commit ({res['shmbuf unavailable']}) "
                     "| | | | | |")
    lines += ["", f"Best queue (the better of 1 rollout or a list of {LIST} a put, the knobs the targets name): "
              f"{sm['best queue'] or '-'}. Packed, the generator writes the trainer's batch itself (no "
              "rollout boundaries kept between generator and trainer): shown, not a target's."]
    ip = res.get("in process")
    if ip:
        lines += ["", f"In this process: take(max_tokens={BUDGET:,}) of a full queue {ip['take s'] * 1e6:,.0f} us, "
                  f"a memcpy of its {ip['batch bytes'] / 1e3:,.0f} KB into a fresh array (as take's output is) "
                  f"{ip['memcpy s'] * 1e6:,.0f} us, into a reused one {ip['memcpy reused s'] * 1e6:,.0f} us (take / that: "
                  f"{ip['take / memcpy reused']:.1f}; medians of "
                  f"{ip['takes']}); take(..., out=) of the batch before "
                  + (f"{ip['take out= s'] * 1e6:,.0f} us ({ip['take out= / memcpy reused']:.1f}x that memcpy)"
                     if "take out= s" in ip else "-")
                  + f"; extend of {LIST} rollouts ({ip['extend bytes'] / 1e3:,.0f} KB) "
                  f"{ip['extend s'] * 1e6:,.0f} us, {ip['extend / memcpy']:.1f}x a memcpy of its bytes (median of "
                  f"{ip['extends']}); full: {ip['rows stored when full']} rows, {ip['payload bytes'] / 2**20:,.1f} MiB "
                  f"of payload in a segment of {ip['segment bytes'] / 2**20:,.1f} MiB."]
    lines += ["", "| target | ratio | wanted | met |", "|---|---:|---|---|"]
    for what, v, want, lim, higher in sm["targets"]:
        met = "-" if v is None or lim is None else ("yes" if (v >= lim if higher else v <= lim) else "**no**")
        lines.append(f"| {what} | {'-' if v is None else f'{v:.2f}'} | {want} | {met} |")
    return "\n".join(lines)


def failed(res: dict[str, Any]) -> list[str]:
    """The arms with a failed round (a mismatch is a bug: the run says so and exits 1)."""
    return [n for n, runs in res["arms"].items() if any("error" in r for r in runs)]


def save(res: dict[str, Any], folder: str = "results", stem: str = "bench-ragged",
         text: Callable[[dict[str, Any]], str] | None = None) -> str:
    """Write ``res`` as JSON and as markdown (``text``, default :func:`markdown`) under
    ``folder``, named ``stem`` and the time; returns the JSON's path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    with open(path.replace(".json", ".md"), "w") as f:
        f.write((text or markdown)(res) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ragged", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 s windows, one round: under a minute")
    p.add_argument("--window", type=float, help="seconds per window")
    p.add_argument("--rounds", type=int)
    p.add_argument("--results", default="results", help="folder for the JSON and markdown files")
    a = p.parse_args(argv)
    res = run(a.quick, a.window, a.rounds)
    print(markdown(res))
    print(f"\nsaved {save(res, a.results)}", file=sys.stderr)
    return 1 if failed(res) else 0


if __name__ == "__main__":
    raise SystemExit(main())
