"""The storm of add_each writers and priority updates: writers of several lanes each
(the envs of a vector env step, a priority per row), learners that sample and update,
both stopped at chosen points of a write or a tree change; and what a buffer holds
afterwards, checked slot by slot.

Rows are storm rows (:func:`~helpers.storm.storm_rows`): writer ``w``'s step ``s`` puts
key ``w * 10**9 + s * 16 + j`` into its ``j``-th lane. Every priority a writer or a
learner gives a row is one of its key's family (:func:`family`), so a leaf tells whose
it is. Code that runs in child processes lives here, importable by name.
"""

from __future__ import annotations

import math
import os
import signal
import time

import numpy as np

import shmbuf
from shmbuf.core import ring
from shmbuf.core.layout import published
from shmbuf.priority import trees
from shmbuf.priority.trees import largest_leaf

from .storm import storm_rows, storm_torn

__all__ = ["ALPHA", "each_writer", "family", "held_rows", "prio_storm_learner", "read_events"]

ALPHA = 1.25  # (above 1: a p**a near the largest a leaf may hold has a finite p)
NEAR = 5  # the family member near the bound


def family(keys: np.ndarray, capacity: int) -> np.ndarray:
    """``(n, 6)`` priorities of the rows ``keys``: five ordinary ones, and one whose
    ``p**ALPHA`` is near the largest a leaf may hold (0.55 of it, at most). Each row's
    are its own: keys with another ``key % 1009`` have none of them."""
    code = 1 + (np.asarray(keys) % 1009) / 4096
    most = math.exp(math.log(largest_leaf(capacity)) / ALPHA)
    return np.stack([code * b for b in (0.5, 1.0, 2.0, 4.0, 8.0)] + [most * 0.5 * code], axis=1)


def _pick(rng, keys: np.ndarray, capacity: int, near: float = 0.05) -> np.ndarray:
    m = np.where(rng.random(len(keys)) < near, NEAR, rng.integers(0, NEAR, len(keys)))
    return family(keys, capacity)[np.arange(len(keys)), m]


def _log(fd: int, *words) -> None:
    os.write(fd, (" ".join(map(str, words)) + "\n").encode())


def read_events(path: str) -> list[list[str]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f.read().splitlines() if line]


def _stop_here(flag: str, go: str) -> None:
    open(flag, "w").close()
    while not (go and os.path.exists(go)):
        time.sleep(0.005)


def each_writer(name: str, w: int, lanes: list[int], claim: bool, log: str, stop: str, capacity: int,
                hang: str = "", flag: str = "", go: str = "", steps: int = -1, ghost: bool = False,
                before: str = "") -> None:
    """``add_each`` of storm rows into ``lanes`` (lane ``lanes[j]`` gets the ``j``-th),
    a step after another, until ``stop`` exists (or ``steps`` steps), each row at a
    priority of its family (5% near the bound; ``ghost``: step 0's first row near it,
    every other row the second of its family). ``claim``: this process claims the lanes
    (a handle each): the native path writes them in one call. Logs "B s" before step
    ``s`` and after it "W s seq..." (the rows' sequence numbers in their lanes), "I s"
    (interrupted: a SIGINT raises KeyboardInterrupt inside ``add_each`` only), "R s"
    (refused, none written: a lane claimed by another process) or "P s" (stopped after
    some rows: the message names them). While ``stop + ".refusing"`` exists, it logs "H s"
    before step ``s`` and holds until ``stop + ".claimed"`` exists, writes that step, then
    writes no more (the storm claims a lane meanwhile, and looks at that step's rows).

    ``hang="point@k@s"``: at the ``k``-th call of the ring's hook ``point`` in step
    ``s`` (0 if left out), touch ``flag`` and wait for ``go`` (for good, without it; a
    SIGINT there interrupts the write). ``before``: wait for that file before step ``s``."""
    inside = [False]

    def on_sigint(signum, frame):
        if inside[0]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    buf = shmbuf.Buffer.attach(name, timeout=60, seed=w)
    owners = []
    if claim:
        for lane in lanes:
            owners.append(shmbuf.Buffer.attach(name, timeout=60))
            owners[-1].claim_lane(lane, timeout=60)
        buf.prefault()
    point, _, rest = hang.partition("@")
    nth, _, at_step = rest.partition("@")
    at_step = int(at_step or 0)
    calls, step = [0], 0

    def hook(where: str) -> None:
        if where == point and step == at_step:
            calls[0] += 1
            if calls[0] == int(nth or 1):
                ring.set_hook(None)
                _stop_here(flag, go)

    if point:
        ring.set_hook(hook)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rng = np.random.default_rng(w)
    lanes_ = np.array(lanes, np.int64)
    while not os.path.exists(stop) and step != steps:
        seq = step * 16 + np.arange(len(lanes))
        keys = w * 1_000_000_000 + seq
        p = _pick(rng, keys, capacity)
        if ghost:
            p = family(keys, capacity)[:, 1] if step else np.r_[family(keys[:1], capacity)[0, NEAR],
                                                               family(keys[1:], capacity)[:, 1]]
        while before and step == at_step and not os.path.exists(before):
            time.sleep(0.005)
        refusing = os.path.exists(stop + ".refusing")  # (the storm's refusal round: see below)
        if refusing:
            _log(fd, "H", step)
            while not os.path.exists(stop + ".claimed") and not os.path.exists(stop):
                time.sleep(0.005)
        _log(fd, "B", step)
        try:
            inside[0] = True
            buf.add_each(storm_rows(w, seq), lanes_, priority=p, timeout=60)
            inside[0] = False
            _log(fd, "W", step, *(buf.engine.heads()[lanes_] - 1).tolist())
        except KeyboardInterrupt:
            inside[0] = False
            _log(fd, "I", step)
        except RuntimeError as exc:
            inside[0] = False
            _log(fd, "R" if "none of the" in str(exc) else "P", step)
        step += 1
        while refusing and not os.path.exists(stop):  # (its rows stay as this step left them)
            time.sleep(0.005)
    for h in owners:
        h.close()
    buf.close()


def prio_storm_learner(name: str, log: str, stop: str, batch: int, capacity: int, hang: str = "",
                       flag: str = "", go: str = "", hold: bool = False) -> None:
    """Sample ``batch`` rows by priority and update them (priorities of their keys'
    families, 5% near the bound) until ``stop`` exists; log "X n" for torn rows, "T"
    for a sample that timed out, "U applied" for each update. A SIGINT raises
    KeyboardInterrupt inside ``sample`` and ``update_priorities`` only (held off by a
    tree change until it is done); the loop goes on.

    ``hang``: at that point of the trees' hook ("changing", "leaves", "changed"; the
    lock held), touch ``flag`` and wait for ``go`` (for good, without it). ``hold``:
    sample once, touch ``flag``, wait for ``go``, update those rows and log "U applied"."""
    inside = [False]

    def on_sigint(signum, frame):
        if inside[0]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    buf = shmbuf.Buffer.attach(name, timeout=60, seed=os.getpid())
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rng = np.random.default_rng(os.getpid())
    if hang:
        def hook(where: str) -> None:
            if where == hang:
                trees.HOOK = None
                _stop_here(flag, go)
        trees.HOOK = hook
    while not os.path.exists(stop):
        try:
            inside[0] = True
            b = buf.sample(batch, beta=0.5, timeout=5)
            inside[0] = False
        except shmbuf.SampleTimeout:
            inside[0] = False
            _log(fd, "T")
            continue
        except (TimeoutError, KeyboardInterrupt):
            inside[0] = False
            continue
        except ValueError:  # (no row published yet: the writers have just started)
            inside[0] = False
            time.sleep(0.005)
            continue
        if storm_torn(b):
            _log(fd, "X", storm_torn(b))
        if hold:
            _stop_here(flag, go)
        try:
            inside[0] = True
            applied = buf.update_priorities(b["index"], _pick(rng, b["a"][:, 0], capacity), timeout=5)
            inside[0] = False
        except (TimeoutError, KeyboardInterrupt):
            inside[0] = False
            continue
        _log(fd, "U", applied)
        if hold:
            break
    buf.close()


def held_rows(buf, lanes=None) -> dict[str, np.ndarray]:
    """Every row the buffer holds (published, in its lane's window) in ``lanes`` (all),
    read raw (nobody writes them now): its slot, lane, sequence number, key and whether
    its fields agree."""
    r = buf.engine.ring
    lo, head = buf.engine.window()
    lc = r.lane_capacity
    lanes = range(len(lo)) if lanes is None else lanes
    lane = np.concatenate([np.full(int(head[i] - lo[i]), i) for i in lanes] + [np.zeros(0, int)])
    seq = np.concatenate([np.arange(lo[i], head[i]) for i in lanes] + [np.zeros(0, int)])
    slot = lane * lc + seq % lc
    there = r.stamps[slot] == published(seq)
    lane, seq, slot = lane[there], seq[there], slot[there]
    rows = {k: r.arrays[k][slot] for k in ("a", "b", "c")}
    whole = np.array([storm_torn({k: v[i:i + 1] for k, v in rows.items()}) == 0 for i in range(len(slot))], bool)
    return {"slot": slot, "lane": lane, "seq": seq, "key": rows["a"][:, 0], "whole": whole}
