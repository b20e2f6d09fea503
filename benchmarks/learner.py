"""The learner first: a learner's batches while writers write, when the buffer's rate
limit holds writers to what the learner samples (``shmbuf-lf`` in the tables).

Unthrottled writers of large rows (atari frames) take most of the memory's bandwidth: a
writer adding 64 frames a call writes 20 GB/s on the 2-core benchmark machine, and a
learner sampling beside it gets what is left. A :class:`shmbuf.RateLimit` is the knob that
gives the learner priority: writers wait while they are more than ``error_buffer``
samples ahead of ``samples_per_insert`` times what the learner sampled (Reverb's
``SampleToInsertRatio``; it also holds the learner to the writers). Measured after the
main systems are closed (its buffer is another copy of the workload's memory), with the
main run's writer processes and windows.
"""

from __future__ import annotations

from typing import Any

import shmbuf

from benchmarks.config import Config, Results
from benchmarks.peers import BATCH, ShmbufSystem, Workload

SAMPLES_PER_INSERT = 2.0
"""Each inserted row sampled twice on average (DQN on Atari samples each about 8 times:
32 rows per 4 steps; distributed learners fewer): writers then insert 128 rows per
batch of 256 the learner samples."""

NAME = "shmbuf-lf"


class LearnerFirst(ShmbufSystem):
    """shmbuf (native path, one lane per writer) created with a rate limit. Its
    ``min_size`` is the rows the fill inserts, so writers and learner start in balance."""

    def __init__(self, wl: Workload, lanes: int = ShmbufSystem.LANES) -> None:
        rate = shmbuf.RateLimit(min_size=self.fill_rows(wl), samples_per_insert=SAMPLES_PER_INSERT,
                                error_buffer=4 * BATCH * max(1.0, SAMPLES_PER_INSERT))
        super().__init__(wl, lanes=lanes, rate=rate, name=NAME)
        self.limit = rate
        self._out = self.buf.empty_batch(BATCH)

    @staticmethod
    def fill_rows(wl: Workload) -> int:
        """The rows :meth:`ShmbufSystem.fill` inserts (1,024 a call, or the data's rows)."""
        step = 1024 if wl.row_bytes < 4096 else 64
        return wl.capacity // step * step

    def sampler(self) -> Any:
        """The default call, waiting at most 0.05 s on the rate limit: None where it
        waited in vain (the window counts only batches; a writer may have stopped
        before the learner's window ended, and a learner waiting on it would raise
        after the buffer's timeout)."""
        sample = self.buf.sample

        def one() -> Any:
            try:
                return sample(BATCH, timeout=0.05)
            except shmbuf.SampleTimeout:
                return None
        return one

    def unblock(self) -> None:
        try:  # a writer waits on the rate limit: sample what lets it finish its call
            self.buf.sample(BATCH, out=self._out, timeout=0.01)
        except shmbuf.SampleTimeout:
            pass


def measure(r: Results, wl: Workload, cfg: Config, note: Any) -> None:
    """``sample +1w``, ``writer during sample`` and the end-to-end figures of
    :class:`LearnerFirst`, recorded as system ``shmbuf-lf``."""
    from benchmarks.run import E2E_CHUNK, WriterPool

    r.extra["learner first: samples per insert"] = SAMPLES_PER_INSERT
    note(f"{wl.name}: building and filling {NAME} (the learner first)")
    s = LearnerFirst(wl)
    s.fill(wl.data(1024 if wl.row_bytes < 4096 else 64, 3))
    pool = WriterPool(s)
    try:
        for rep in range(cfg.repeats):
            note(f"{wl.name} repeat {rep + 1}/{cfg.repeats}: {NAME}, sample +1w")
            res = pool.window(1, E2E_CHUNK, cfg.window, "sample")
            r.add(wl.name, "sample +1w", NAME, res["batches/s"])
            r.add(wl.name, "writer during sample", NAME, res["rows/s"])
            if rep < cfg.e2e_repeats:
                note(f"{wl.name} repeat {rep + 1}/{cfg.repeats}: {NAME}, e2e")
                res = pool.window(2, E2E_CHUNK, cfg.e2e_window, "sample")
                r.add(wl.name, "e2e ingest", NAME, res["rows/s"])
                r.add(wl.name, "e2e batches", NAME, res["batches/s"])
    finally:
        pool.close()
        s.close()
