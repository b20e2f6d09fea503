"""Queues: rows derived from (writer, sequence number), writers and takers that log what
returned, and takers stopped at a chosen point of a take.

Code that runs in child processes lives here, importable by name.
"""

from __future__ import annotations

import os
import time

import numpy as np

import shmbuf
from shmbuf.queue import protocol as queue_protocol

from .processes import hang_at

QUEUE_FIELDS = {"w": ((), "int64"), "i": ((), "int64"), "img": ((3, 16), "uint8")}


def queue_rows(writer: int, lo: int, hi: int) -> dict:
    i = np.arange(lo, hi)
    img = ((writer * 31 + i) % 251).astype(np.uint8)[:, None, None] * np.ones((3, 16), np.uint8)
    return {"w": np.full(hi - lo, writer), "i": i, "img": img}


def queue_torn(batch: dict) -> int:
    """Rows whose image is not the one written with their (writer, i)."""
    want = ((batch["w"] * 31 + batch["i"]) % 251).astype(np.uint8)
    return int((batch["img"] != want[:, None, None]).any(axis=(1, 2)).sum())


def keys(batch: dict) -> np.ndarray:
    return batch["w"] * 1_000_000_000 + batch["i"]


def _log(fd: int, tag: str, values) -> None:
    os.write(fd, (tag + " " + ",".join(map(str, np.asarray(values).tolist())) + "\n").encode())


def read_log(path) -> list[tuple[str, np.ndarray]]:
    out = []
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
        for line in text.splitlines():
            tag, _, rest = line.partition(" ")
            out.append((tag, np.array([int(x) for x in rest.split(",") if x], np.int64)))
    return out


def queue_writer(name: str, writer: int, rows: int, chunk: int, log: str, hang: str = "", flag: str = "",
                 after: int = 0, stop: str = "") -> None:
    """Write rows (writer, 0 .. rows-1) in chunks, or until ``stop`` exists; log
    "W <count>" after each write returned. ``hang``: stop forever at that write point
    once ``after`` rows returned."""
    q = shmbuf.Buffer.attach(name, timeout=60)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rng = np.random.default_rng(writer)
    i = 0
    while i < rows and not (stop and os.path.exists(stop)):
        if hang and i >= after:
            hang_at(hang, flag)
        k = int(min(rows - i, rng.integers(1, chunk + 1)))
        q.extend(queue_rows(writer, i, i + k), timeout=120)
        i += k
        _log(fd, "W", [i])


def queue_taker(name: str, log: str, stop: str, batch: int, hang: str = "", flag: str = "") -> None:
    """Take up to ``batch`` rows at a time until ``stop`` exists (and nothing is left):
    log "C <keys>" once a take's rows are copied (before they are delivered) and
    "D <keys>" once it returned, plus "X <count>" for torn rows. ``hang``: stop forever
    at that point of the first take instead."""
    q = shmbuf.Buffer.attach(name, timeout=60)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def hook(where: str, rows) -> None:
        if where == "copied":  # a take's rows are copied: from here they may be delivered
            _log(fd, "C", keys(rows))
        if hang and where == hang.split("@")[0]:
            if "@" in hang:  # "commit@k": the k-th commit of this process
                hook.seen = getattr(hook, "seen", 0) + 1
                if hook.seen != int(hang.split("@")[1]):
                    return
            open(flag, "w").close()
            while True:
                time.sleep(1)
    queue_protocol.HOOK = hook
    while True:
        try:
            b = q.take(batch, partial=True, timeout=0.2)
        except (shmbuf.SampleTimeout, shmbuf.LockTimeout):  # (none yet, or a loaded machine kept the lock busy)
            if os.path.exists(stop):
                return
            continue
        _log(fd, "D", keys(b))
        torn = queue_torn(b)
        if torn:
            _log(fd, "X", [torn])
        # per lane (writer), this take's rows are in write order
        for w in np.unique(b["w"]):
            if (np.diff(b["i"][b["w"] == w]) <= 0).any():
                _log(fd, "O", [w])
