"""Writers yield to a learner's large gather (shmbuf/core/yielding.py, csrc/write.c):
the learner marks its large copies only and clears the mark after them, a writer that
finds the mark waits before it reserves, a mark left by a dead learner holds writes up
once and loses nothing, and ``writers_yield=False`` turns it all off."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

import shmbuf
from shmbuf.core import gather, native, yielding
from shmbuf.core.layout import CTRL_YIELD

FRAME = {"frame": ((64, 64), "uint8"), "i": ((), "int64")}  # 4 kB a row: 256 rows pass yielding.LARGE


def _rows(first, n):
    i = np.arange(first, first + n)
    return {"frame": np.broadcast_to((i % 251).astype(np.uint8)[:, None, None], (n, 64, 64)), "i": i}


def _intact(batch):
    return bool((batch["frame"] == (batch["i"] % 251).astype(np.uint8)[:, None, None]).all())


def _seen_during_copies(monkeypatch, ring):
    """The mark as each checked gather of ``ring`` saw it while it copied."""
    seen = []
    copy = gather._copy_windows

    def spy(r, *args):
        if r is ring:
            seen.append(int(r.control[CTRL_YIELD]))
        return copy(r, *args)
    monkeypatch.setattr(gather, "_copy_windows", spy)
    return seen


def _starved(ring):
    """As if the learner's last large copy had taken far longer than its fastest."""
    ring.yielding.best, ring.yielding.per_byte = 1e-12, 1e-9


def test_a_learner_copying_at_its_speed_asks_nobody_to_wait(name, monkeypatch):
    with shmbuf.Buffer.create(FRAME, 1024, name=name, seed=0) as buf:
        buf.extend(_rows(0, 1024))
        ring = buf.engine.ring
        seen = _seen_during_copies(monkeypatch, ring)
        ring.yielding.best = ring.yielding.per_byte = 1e-9  # (its last copy was its fastest)
        assert _intact(buf.sample(256)) and seen == [0]
        assert ring.yielding.best <= 1.01e-9  # (and it learnt from this one)


def test_a_large_gather_marks_writers_to_wait_and_clears_the_mark_after(name, monkeypatch):
    with shmbuf.Buffer.create(FRAME, 1024, name=name, seed=0) as buf:
        buf.extend(_rows(0, 1024))
        ring = buf.engine.ring
        seen = _seen_during_copies(monkeypatch, ring)
        before = time.monotonic_ns()
        _starved(ring)
        big = buf.sample(256)  # 1 MiB and more, by a learner that writers slowed down
        assert len(seen) == 1 and seen[0] > before  # until when writers should wait
        assert seen[0] <= time.monotonic_ns() + yielding.LONGEST * 1e9
        assert int(ring.control[CTRL_YIELD]) == 0  # cleared once copied
        _starved(ring)
        small = buf.sample(16)  # 64 kB: writers are not asked to wait
        assert seen[1:] == [0] and _intact(big) and _intact(small)
        _starved(ring)
        buf.sample_sequences(4, 64)  # every sampler's gather, not only sample()
        assert seen[2] > 0 and int(ring.control[CTRL_YIELD]) == 0


def test_writers_yield_false_marks_nothing_on_any_handle(name, monkeypatch):
    with shmbuf.Buffer.create(FRAME, 1024, name=name, seed=0, writers_yield=False) as buf, \
            shmbuf.Buffer.attach(name) as other:
        assert isinstance(other.engine.ring.yielding, yielding.NoYield)
        other.extend(_rows(0, 1024))
        other.engine.ring.yielding.best, other.engine.ring.yielding.per_byte = 1e-12, 1e-9  # (NoYield: no effect)
        seen = _seen_during_copies(monkeypatch, other.engine.ring)
        assert _intact(other.sample(512)) and seen == [0]
        buf.engine.ring.control[CTRL_YIELD] = time.monotonic_ns() + 60 * 10**9  # (as if a learner asked)
        if native.path() == "native":
            native.extension().trace_steps(True)
            buf.extend(_rows(1024, 4))
            assert "y" in native.extension().trace_steps(False)  # the mark is obeyed where it is set...
        buf.engine.ring.control[CTRL_YIELD] = 0


@pytest.mark.parametrize("bad", [1, "False", None])
def test_a_bad_writers_yield_is_refused_before_anything_is_made(name, bad):
    with pytest.raises(TypeError, match="writers_yield must be True or False"):
        shmbuf.Buffer.create(FRAME, 16, name=name, writers_yield=bad)
    with pytest.raises(FileNotFoundError):
        shmbuf.Buffer.attach(name, timeout=0)


def test_a_writer_that_finds_the_mark_waits_before_it_reserves_and_writes_once_it_clears(name, monkeypatch):
    with shmbuf.Buffer.create(FRAME, 1024, name=name, seed=0) as buf:
        ring = buf.engine.ring
        ring.control[CTRL_YIELD] = time.monotonic_ns() + 60 * 10**9
        if native.path() == "native":
            native.extension().trace_steps(True)
            buf.extend(_rows(0, 8))  # waits (at most 20 ms: the mark is set for a minute)
            steps = native.extension().trace_steps(False)
            assert steps.startswith("y") and steps.index("y") < steps.index("o"), steps  # before it stamped
        else:
            waits = []

            def sleep(seconds):  # the learner clears the mark while the writer waits
                waits.append((len(buf), seconds))
                ring.control[CTRL_YIELD] = 0
            monkeypatch.setattr(yielding.time, "sleep", sleep)
            buf.extend(_rows(0, 8))
            assert waits == [(0, yielding._STEP)]  # one wait, before a row was reserved
        assert len(buf) == 8 and _intact(buf.sample(8))


def _learner_killed_while_it_copies(name):
    """A learner that SIGKILLs itself inside its gather, its mark set (a chosen point)."""
    buf = shmbuf.Buffer.attach(name)

    def die(*args):
        os.kill(os.getpid(), signal.SIGKILL)
    gather._copy_windows = die
    _starved(buf.engine.ring)
    buf.sample(512)


def test_a_learner_killed_inside_its_gather_holds_writers_up_once_and_loses_nothing(name):
    with shmbuf.Buffer.create(FRAME, 1024, name=name, seed=0) as buf:
        buf.extend(_rows(0, 1024))
        p = mp.get_context("fork").Process(target=_learner_killed_while_it_copies, args=(name,))
        p.start()
        p.join(60)
        assert p.exitcode == -signal.SIGKILL
        mark = int(buf.engine.ring.control[CTRL_YIELD])
        assert mark > 0  # left behind: at most LONGEST after the learner began
        for k in range(10):  # every write completes within its timeout, and is kept
            buf.extend(_rows(1024 + 8 * k, 8), timeout=10)
        got = buf.sample(1024)
        assert _intact(got) and got["i"].max() == 1024 + 79


@pytest.mark.parametrize("timeout", [10.0, float("inf"), 1e10])
def test_a_write_without_a_deadline_yields_like_any_other(name, timeout):
    # (an infinite deadline was converted to an integer: OverflowError on the pure path,
    # undefined behaviour and no wait at all on the native one)
    with shmbuf.Buffer.create(FRAME, 64, name=name, seed=0) as buf:
        buf.engine.ring.control[CTRL_YIELD] = time.monotonic_ns() + 60 * 10**9
        if native.path() == "native":
            native.extension().trace_steps(True)
        buf.extend(_rows(0, 4), timeout=timeout)
        if native.path() == "native":
            assert native.extension().trace_steps(False).startswith("y")
        assert len(buf) == 4 and _intact(buf.sample(4))
