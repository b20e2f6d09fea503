"""max_times_sampled: samplers that log every row they returned, and samplers stopped at
a chosen point of a count (under the lock, or just after it).

Code that runs in child processes lives here, importable by name.
"""

from __future__ import annotations

import os
import time

import numpy as np

import shmbuf
from shmbuf.samplers import limited

from .storm import STORM, storm_rows, storm_torn

__all__ = ["COUNTED", "counted_buffer", "counting_sampler", "count_and_stop", "returned_keys", "write_keys"]

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
