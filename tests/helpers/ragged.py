"""Ragged rows under storms: rows whose every value (and every length) derives from
(writer, index), writers that log what they attempted and what returned and stop at a
chosen point of a write (the ring's points, the arena's "record", or those of a write
whose records start at the arena's start), queue takers and replay samplers that check
every row whole.

Code that runs in child processes lives here, importable by name.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

import shmbuf
from shmbuf.core import arena, ring
from shmbuf.queue import protocol as queue_protocol

from .queues import _log

__all__ = ["STATE_FIELDS", "state_row", "state_whole", "RAGGED_FIELDS", "SPECIAL", "ragged_lengths", "ragged_rows", "ragged_bytes", "ragged_torn", "ragged_keys",
           "ragged_writer", "ragged_taker", "ragged_sampler", "ragged_consumer", "align", "fill_lane"]

RAGGED_FIELDS = {"tokens": (("R",), np.int32), "logprobs": (("R",), np.float32), "prompt": ((None,), np.int32),
                 "w": ((), np.int64), "i": ((), np.int64)}
SPECIAL = {96: "stale rows (the queue storm's last phase)", 97: "fillers: no tokens, a prompt of i % 10_000 values", 98: "128 tokens, no prompt",
           99: "128 tokens, no prompt"}
"""Writers whose rows have lengths of a test's choosing (the storms' last phases):
the others' lengths are pseudo-random, 0 .. 300 tokens (every fifth row empty) and 0 ..
40 prompt values."""


def ragged_keys(batch: dict) -> np.ndarray:
    return batch["w"] * 1_000_000_000 + batch["i"]


def ragged_lengths(w: np.ndarray, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens (length "R") and prompt values of rows (w, i)."""
    w, i = np.asarray(w, np.int64), np.asarray(i, np.int64)
    tokens = np.where(i % 5 == 0, 0, (w * 7919 + i * 104729) % 301)  # (w=96: these too)
    prompt = (w * 31 + i * 17) % 41
    tokens = np.where(w == 97, 0, np.where(w >= 98, 128, tokens))
    prompt = np.where(w == 97, i % 10_000, np.where(w >= 98, 0, prompt))
    return tokens, prompt


def ragged_bytes(w: int, lo: int, hi: int) -> np.ndarray:
    """Record bytes of rows (w, lo .. hi-1): each field padded to 8 bytes."""
    t, p = ragged_lengths(np.full(hi - lo, w), np.arange(lo, hi))
    return 2 * arena.pad(4 * t) + arena.pad(4 * p)


def _values(key: int, tokens: int, prompt: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (((key * 7 + np.arange(tokens)) % 2**31).astype(np.int32),
            -(np.arange(tokens) + key % 4096).astype(np.float32),
            (key % 100_003 + 3 * np.arange(prompt)).astype(np.int32))


def ragged_rows(w: int, lo: int, hi: int) -> dict:
    """Rows (w, lo .. hi-1) as an ``extend`` takes them."""
    i = np.arange(lo, hi)
    tl, pl = ragged_lengths(np.full(hi - lo, w), i)
    vals = [_values(w * 1_000_000_000 + k, int(a), int(b)) for k, a, b in zip(i.tolist(), tl.tolist(), pl.tolist())]
    return {"tokens": [v[0] for v in vals], "logprobs": [v[1] for v in vals], "prompt": [v[2] for v in vals],
            "w": np.full(hi - lo, w), "i": i}


def ragged_torn(batch: dict) -> int:
    """Rows of a batch that are not the row their (w, i) names, whole: its lengths and
    every value of every ragged field."""
    torn = 0
    tl, pl = ragged_lengths(batch["w"], batch["i"])
    for r, key in enumerate(ragged_keys(batch).tolist()):
        want = _values(key, int(tl[r]), int(pl[r]))
        got = (batch["tokens"][r], batch["logprobs"][r], batch["prompt"][r])
        if any(g.shape != v.shape or not (g == v).all() for g, v in zip(got, want)):
            torn += 1
    return torn


def align(buf, lane: int, **kw) -> list[int]:
    """(The storms' last phases) if the lane's arena head is not at a start of its arena,
    write a filler row (w=97: a prompt of the bytes left) up to its end. Returns the
    (w, i) keys written."""
    records = buf.engine.ring.records
    head = int(records.heads[lane, 0])
    if not head % records.A:
        return []
    gap = records.A - head % records.A
    i = (head // records.A * 8 + lane) * 10_000 + gap // 4  # (a prompt of gap // 4 values: a record of gap bytes)
    buf.extend(ragged_rows(97, i, i + 1), lane=lane, **kw)
    return [97 * 1_000_000_000 + i]


def fill_lane(buf, w: int, lane: int, rows: int, **kw) -> list[int]:
    """(The storms' last phases) ``rows`` rows of writer ``w`` (1,024 record bytes each,
    indexed by the arena head), from a start of the lane's arena (:func:`align` first):
    they lie where the same call's rows of the next lap will. Returns the keys written."""
    keys = align(buf, lane, **kw)
    records = buf.engine.ring.records
    for _ in range(rows):
        i = int(records.heads[lane, 0]) * 10 + lane
        buf.extend(ragged_rows(w, i, i + 1), lane=lane, **kw)
        keys.append(w * 1_000_000_000 + i)
    return keys


def _hang_hooks(buf, lane: int, hang: str, flag: str, state: dict) -> None:
    """Stop at ``hang`` ("locked", "reserved", "writing", "published": the ring's points;
    "record": mid-record; "wrap:<point>": that point of a write whose records start at the
    arena's start) of the writes made while ``state["armed"]``."""
    wrap, _, point = hang.rpartition(":")
    records = buf.engine.ring.records

    def at(where: str) -> None:
        if not state["armed"]:
            return
        if wrap and where == "locked":  # (our H just moved: our records end there)
            start = int(records.heads[lane, 0]) - state["total"]
            state["wraps"] = state["total"] > 0 and start > 0 and start % records.A == 0
        if where == point and (not wrap or state["wraps"]):
            open(flag, "w").close()
            while True:
                time.sleep(0.01)

    ring.set_hook(at)
    arena.HOOK = at


def ragged_writer(name: str, w: int, lane: int, version: int | None, log: str, stop: str, hang: str = "",
                  flag: str = "", after: int = 0, claim: bool = False) -> None:
    """Write rows (w, 0, 1, ...) into ``lane`` (``claim``: claimed, else shared) until
    ``stop`` exists: 1 .. 4 rows a write (``add`` for one), as many as fit a lane's arena;
    log "A lo,hi" before each write and "W lo,hi" once it returned, "I lo,hi" if a SIGINT
    interrupted it (a SIGINT raises KeyboardInterrupt only inside a write; the loop goes
    on, its indices never reused). ``hang``: stop at that point (see :func:`_hang_hooks`)
    of the first write that gets there once ``after`` writes returned, touching ``flag``."""
    inside = [False]

    def on_sigint(signum, frame):
        if inside[0]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    buf = shmbuf.Buffer.attach(name, timeout=60)
    kw: dict = {"timeout": 120}
    if claim:
        buf.claim_lane(lane, timeout=60)
    else:
        kw["lane"] = lane
    if version is not None:
        kw["version"] = version
    A = buf.engine.ring.records.A
    state = {"armed": False, "total": 0, "wraps": False}
    if hang:
        _hang_hooks(buf, lane, hang, flag, state)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rng = np.random.default_rng(w)
    i = done = 0
    while not os.path.exists(stop):
        k = int(rng.integers(1, 5))
        while k > 1 and ragged_bytes(w, i, i + k).sum() > A:
            k -= 1
        rows = ragged_rows(w, i, i + k)
        state["total"] = int(ragged_bytes(w, i, i + k).sum())
        state["armed"] = bool(hang) and done >= after
        _log(fd, "A", [i, i + k])
        try:
            inside[0] = True
            if k == 1:
                buf.add({f: v[0] for f, v in rows.items()}, **kw)
            else:
                buf.extend(rows, **kw)
            inside[0] = False
        except KeyboardInterrupt:
            inside[0] = False
            state["armed"], hang = False, ""
            _log(fd, "I", [i, i + k])
            i += k
            continue
        _log(fd, "W", [i, i + k])
        done += 1
        i += k


def ragged_taker(name: str, log: str, stop: str, batch: int, bound: int, version: int, budget: int,
                 hang: str = "", flag: str = "") -> None:
    """Take up to ``batch`` rows at a time until ``stop`` exists, in turn: a plain take,
    one with ``max_staleness=version - bound, version=version``, one with that and
    ``max_tokens=budget, length="R"``; log "C <keys>" once a take's rows are copied
    (before they are delivered), "D <keys>" once it returned, and for the breaches: "X
    <count>" torn rows, "S <count>" rows below the bound from a bounded take, "B <total>"
    a budget passed by more than one row, "O <writer>" a take whose rows of a writer are
    out of order, "F <count>" rows a take refused as changed (FormatError). A SIGINT
    raises KeyboardInterrupt only inside ``take``: the loop goes on. ``hang``: stop at
    that point of the first take (:data:`shmbuf.queue.protocol.HOOK`) for good."""
    inside = [False]

    def on_sigint(signum, frame):
        if inside[0]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    q = shmbuf.Buffer.attach(name, timeout=60)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def hook(where: str, rows) -> None:
        if where == "copied":
            _log(fd, "C", ragged_keys(rows))
        if armed[0] and where == hang:
            armed[0] = False  # (a SIGINT there ends the take; the next ones go on)
            open(flag, "w").close()
            while True:
                time.sleep(0.01)
    armed = [bool(hang)]
    queue_protocol.HOOK = hook

    def report(b: dict, kw: dict) -> None:
        _log(fd, "D", ragged_keys(b))
        if torn := ragged_torn(b):
            _log(fd, "X", [torn])
        if kw and (low := int((b["version"] < bound).sum())):
            _log(fd, "S", [low])
        if "max_tokens" in kw and len(b["w"]) > 1 and (total := int(b["tokens"].lengths.sum())) > budget:
            _log(fd, "B", [total])
        for w in np.unique(b["w"]).tolist():
            if (np.diff(b["i"][b["w"] == w]) <= 0).any():
                _log(fd, "O", [w])

    turn = 0
    while True:
        if os.path.exists(stop):  # (last: the rows a take interrupted after their delivery kept for us)
            try:
                while True:
                    report(q.take(batch, partial=True, timeout=0.2), {})
            except (shmbuf.SampleTimeout, shmbuf.LockTimeout):
                return
        turn += 1
        kw = {} if turn % 3 == 0 else {"max_staleness": version - bound, "version": version}
        if turn % 3 == 2:
            kw.update(max_tokens=budget, length="R")
        try:
            inside[0] = True
            b = q.take(batch, partial=True, timeout=0.2, **kw)
            inside[0] = False
        except (shmbuf.SampleTimeout, shmbuf.LockTimeout, KeyboardInterrupt):
            inside[0] = False
            continue
        except shmbuf.FormatError as exc:  # (only with a protection broken on purpose)
            inside[0] = False
            _log(fd, "F", [int(str(exc).split("the records of ")[1].split()[0])])
            continue
        report(b, kw)


def ragged_sampler(name: str, log: str, stop: str, budget: int, hang: str = "", flag: str = "",
                   go: str = "") -> None:
    """Sample in turn 16 rows and a token budget of ``budget`` ("R") until ``stop``
    exists; log "N <rows checked>, <torn>, <budgets passed>, <timeouts>" every 20 samples
    and at the end, and "T <w>,<i>,<lengths>,<first values>" for each torn row. ``hang="reading"``: the first read that reaches the arena's "reading"
    point (record words proved, no byte copied) touches ``flag`` and waits for ``go``."""
    buf = shmbuf.Buffer.attach(name, timeout=60, seed=os.getpid())
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if hang:
        def hook(where: str) -> None:
            if where == hang:
                arena.HOOK = None
                open(flag, "w").close()
                deadline = time.monotonic() + 120
                while not os.path.exists(go) and time.monotonic() < deadline:
                    time.sleep(0.01)
        arena.HOOK = hook
    counts = np.zeros(4, np.int64)
    turn = 0
    while not os.path.exists(stop):
        if len(buf) == 0:
            time.sleep(0.001)
            continue
        turn += 1
        try:
            b = buf.sample(16, timeout=5) if turn % 2 else buf.sample(max_tokens=budget, length="R", timeout=5)
        except shmbuf.SampleTimeout:
            counts[3] += 1
            continue
        counts[0] += len(b["w"])
        if torn := ragged_torn(b):
            counts[1] += torn
            for j in range(len(b["w"])):  # (which, and how: for the report)
                if ragged_torn({k: v[[j]] for k, v in b.items()}):
                    _log(fd, "T", [int(b["w"][j]), int(b["i"][j]), len(b["tokens"][j]), len(b["prompt"][j]),
                                   *b["tokens"][j][:2].tolist(), *b["prompt"][j][:2].tolist()])
        if turn % 2 == 0 and len(b["w"]) > 1 and int(b["tokens"].lengths.sum()) > budget:
            counts[2] += 1
        if turn % 20 == 0:
            _log(fd, "N", counts)
            counts[:] = 0
    _log(fd, "N", counts)


def ragged_consumer(path: str, log: str, batch: int, hang: str, flag: str, at_take: int) -> None:
    """A trainer on a queue in a buffer file: take ``batch`` rows at a time, log "D
    <keys>" once a take returned (and "X <count>" for torn rows), then ``flush()`` (its
    checkpoint). Its take number ``at_take`` (from 0) stops for good at ``hang`` (a
    take's point, :data:`shmbuf.queue.protocol.HOOK`), touching ``flag``: to be killed."""
    q = shmbuf.Buffer.attach(path, timeout=60)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    turn = [0]

    def hook(where: str, rows) -> None:
        if turn[0] == at_take and where == hang:
            open(flag, "w").close()
            while True:
                time.sleep(0.01)
    queue_protocol.HOOK = hook
    while True:
        b = q.take(batch, partial=True, timeout=60)
        _log(fd, "D", ragged_keys(b))
        if torn := ragged_torn(b):
            _log(fd, "X", [torn])
        q.flush()
        turn[0] += 1


STATE_FIELDS = {"r": (("R",), np.int32), "lp": (("R",), np.float32), "p": ((None, 2), np.int16), "k": ((), np.int64)}
"""Ragged fields of every kind (a shared length, trailing dims, a fixed field) for the
state and save tests: row ``k``'s values are derived from ``k``."""


def state_row(k: int) -> dict:
    n = k % 7 * 3
    return {"r": np.full(n, k, np.int32), "lp": np.full(n, -k, np.float32), "p": np.full((k % 3, 2), k, np.int16),
            "k": k}


def state_whole(b: dict) -> bool:
    """Every row of ``b`` holds the values :func:`state_row` gives its ``k``."""
    return all(b["r"][i].tolist() == [k] * (k % 7 * 3) and (b["lp"][i] == -k).all() and b["p"][i].shape == (k % 3, 2)
               and (b["p"][i] == k).all() for i, k in enumerate(b["k"].tolist()))
