"""max_times_sampled: samplers that log every row they returned, and samplers stopped at
a chosen point of a count (under the lock, or just after it).

Code that runs in child processes lives here, importable by name.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

import shmbuf
from shmbuf.limited import sampler as limited

from .storm import STORM, storm_rows, storm_torn

__all__ = ["COUNTED", "counted_buffer", "counting_sampler", "count_and_stop", "limited_sampler", "limited_writer",
           "returned_keys", "write_keys"]

COUNTED = STORM


def counted_buffer(name: str, capacity: int, k: int, **kw) -> shmbuf.Buffer:
    return shmbuf.Buffer.create(COUNTED, capacity, name=name, max_times_sampled=k, **kw)


def write_keys(name: str, writer: int, rows: int, chunk: int) -> None:
    """Write storm rows (writer, 0 .. rows-1) in chunks of ``chunk``."""
    buf = shmbuf.Buffer.attach(name, timeout=60)
    for lo in range(0, rows, chunk):
        buf.extend(storm_rows(writer, np.arange(lo, min(rows, lo + chunk))), timeout=60)
    buf.close()


def counting_sampler(name: str, log: str, stop: str, batch: int) -> None:
    """Sample ``batch`` rows at a time until ``stop`` exists; after each sample, log the
    keys it returned (one os.write: a SIGKILL loses at most the sample it was in), or
    "T" for a torn row."""
    buf = shmbuf.Buffer.attach(name, timeout=60, seed=os.getpid())
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    while not os.path.exists(stop):
        try:
            b = buf.sample(batch, timeout=0.2)
        except shmbuf.SampleTimeout:
            continue
        torn = storm_torn(b)
        os.write(fd, (("T\n" if torn else "") + " ".join(map(str, b["a"][:, 0].tolist())) + "\n").encode())


def count_and_stop(name: str, point: str, flag: str, n: int) -> None:
    """Sample ``n`` rows, stopping at ``point`` of the count ("counted": holding the
    header lock, counts written; "released": lock released, nothing copied) for good,
    touching ``flag`` there. A SIGINT there ends the sample with KeyboardInterrupt, and
    then this process touches ``flag + ".interrupted"``."""
    buf = shmbuf.Buffer.attach(name, timeout=60)

    def hook(where: str) -> None:
        if where == point:
            open(flag, "w").close()
            while True:
                time.sleep(0.01)

    limited.HOOK = hook
    try:
        buf.sample(n, timeout=600)
    except KeyboardInterrupt:
        limited.HOOK = None
        open(flag + ".interrupted", "w").close()


def returned_keys(paths) -> tuple[dict[int, int], int]:
    """How many times each key was returned across the logs, and the torn rows logged."""
    counts: dict[int, int] = {}
    torn = 0
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f.read().splitlines():
                if line == "T":
                    torn += 1
                    continue
                for key in line.split():
                    counts[int(key)] = counts.get(int(key), 0) + 1
    return counts, torn


def limited_writer(name: str, writer: int, chunk: int, stop: str, done: str, pause: str) -> None:
    """Write storm rows (writer, 0, 1, ...) in chunks of ``chunk`` into lane ``writer``
    (claimed: its writes take no lock) until ``stop`` exists; then touch ``done``. While
    ``pause`` exists it writes nothing, and says so by touching ``done``."""
    buf = shmbuf.Buffer.attach(name, timeout=60)
    buf.claim_lane(writer)
    seq = 0
    while not os.path.exists(stop):
        if os.path.exists(pause):
            open(done, "w").close()
            while os.path.exists(pause) and not os.path.exists(stop):
                time.sleep(0.005)
            continue
        buf.extend(storm_rows(writer, np.arange(seq, seq + chunk)), timeout=60)
        seq += chunk
    open(done, "w").close()
    buf.close()


def limited_sampler(name: str, log: str, stop: str, batch: int, hang: str = "", flag: str = "",
                    go: str = "") -> None:
    """Sample ``batch`` rows at a time until ``stop`` exists; after each sample, log the
    keys it returned (one os.write) and "T" for each torn row. A SIGINT raises
    KeyboardInterrupt only inside ``sample`` (a notebook that catches Ctrl-C and goes
    on): that sample gives its counts back and the loop goes on.

    ``hang``: stop at that point of the first sample's count ("counted", "released",
    "giving back": for the last, the sample is ended first by a KeyboardInterrupt raised
    at "released"), touching ``flag``, until ``go`` exists (never, without ``go``); a
    SIGINT there (outside the lock) ends the sample."""
    inside = [False]

    def on_sigint(signum, frame):
        if inside[0]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    buf = shmbuf.Buffer.attach(name, timeout=60, seed=os.getpid())
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if hang:
        def hook(where: str) -> None:
            if hang == "giving back" and where == "released":
                raise KeyboardInterrupt
            if where == hang:
                limited.HOOK = None
                open(flag, "w").close()
                while not (go and os.path.exists(go)):
                    time.sleep(0.005)
        limited.HOOK = hook
    while not os.path.exists(stop):
        try:
            inside[0] = True
            b = buf.sample(batch, timeout=0.2)
            inside[0] = False
        except (shmbuf.SampleTimeout, shmbuf.LockTimeout, KeyboardInterrupt):
            inside[0] = False
            continue
        torn = storm_torn(b)
        os.write(fd, (("T\n" * torn) + " ".join(map(str, b["a"][:, 0].tolist())) + "\n").encode())
