"""Rate limiting (Reverb's SampleToInsertRatio) across processes: counters in the
header, waits with timeouts, writers and learners held to the ratio."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

import shmbuf
from helpers import kill_when_there, rate_writer, write_rows_then_hang

X = {"x": ((), "int64")}


@pytest.mark.parametrize("kw, match", [
    ({"min_size": 0}, "min_size"), ({"min_size": 1.5}, "min_size"), ({"samples_per_insert": 0}, "> 0"),
    ({"samples_per_insert": float("nan")}, "finite"), ({"error_buffer": -1}, "finite"),
    ({"samples_per_insert": 4, "error_buffer": 2}, "smaller than samples_per_insert"),
])
def test_bad_limits_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        shmbuf.RateLimit(**kw)


def test_a_rate_must_be_a_rate_limit(name):
    with pytest.raises(TypeError, match="RateLimit"):
        shmbuf.Buffer.create(X, 8, name=name, rate={"min_size": 1})


def test_min_size_holds_samples_until_enough_rows_were_inserted(name):
    rate = shmbuf.RateLimit(min_size=100, samples_per_insert=1, error_buffer=50)
    with shmbuf.Buffer.create(X, 1000, name=name, rate=rate, seed=0) as buf:
        buf.extend({"x": np.arange(99)})
        with pytest.raises(shmbuf.SampleTimeout, match=r"99 rows inserted, 0 sampled"):
            buf.sample(1, timeout=0.05)
        ctx = mp.get_context("spawn")
        ready, results = ctx.Barrier(1), ctx.Queue()
        p = ctx.Process(target=rate_writer, args=(name, 1, 1, 30.0, ready, results))
        p.start()
        try:
            got = buf.sample(10, timeout=60)  # released by the other process's insert
        finally:
            p.join(60)
        assert results.get(timeout=10) == 1 and len(got["x"]) == 10 and buf.total_added == 100


def test_writers_wait_for_learners_and_timeouts_name_the_counters(name):
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=10)
    with shmbuf.Buffer.create(X, 100, name=name, rate=rate, seed=0) as buf:
        buf.extend({"x": np.arange(11)})  # diff 11 = 1 * 1 + 10: the upper bound
        with pytest.raises(shmbuf.WriteTimeout, match="writers are ahead"):
            buf.add({"x": 11}, timeout=0.05)
        assert len(buf) == 11  # nothing written
        buf.sample(5)
        buf.add({"x": 11}, timeout=0.05)
        with pytest.raises(ValueError, match="never be sampled"):
            buf.sample(21)  # wider than the window: would wait forever
        other = shmbuf.Buffer.attach(name)  # the limit and the counters are shared
        try:
            other.sample(7)
            with pytest.raises(shmbuf.RateLimitTimeout, match="12 rows inserted, 12 sampled"):
                other.sample(10, timeout=0.05)  # 12 - 12 - 10 < 1 - 10
        finally:
            other.close()


def test_a_fast_learner_is_held_to_the_ratio_of_real_writers(name):
    spi, eb, chunk = 2.0, 64.0, 8
    rate = shmbuf.RateLimit(min_size=16, samples_per_insert=spi, error_buffer=eb)
    ctx = mp.get_context("fork")
    with shmbuf.Buffer.create(X, 4096, name=name, rate=rate, seed=0) as buf:
        ready, results = ctx.Barrier(3), ctx.Queue()
        procs = [ctx.Process(target=rate_writer, args=(name, 10**9, chunk, 2.0, ready, results)) for _ in range(2)]
        for p in procs:
            p.start()
        ready.wait(30)
        low, high = rate.bounds
        seen, deadline = [], time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                buf.sample(32, timeout=0.05)
            except shmbuf.RateLimitTimeout:
                pass
            inserted, sampled = buf.engine.gate.counts()
            seen.append(inserted * spi - sampled)
        written = [results.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(30)
        inserted, sampled = buf.engine.gate.counts()
        assert sampled > 0 and min(written) > 0
        assert inserted == sum(written)
        # the learner never ran ahead of the writers, the writers never more than a
        # write each (their checks take no lock) ahead of the learner
        assert min(seen) >= low and max(seen) <= high + 2 * chunk * spi, (min(seen), max(seen))


@pytest.mark.both_storages
def test_a_killed_writer_holds_the_learner_only_until_its_timeout(name, tmp_path):
    """A writer that wrote 10 rows (of the 1000 the limit wants first) is SIGKILLed inside
    its 11th write: the learner waits for rows only until its timeout, then gets
    RateLimitTimeout saying why. The writer is stopped at that row, not raced: it can never
    reach min_size first, however the machine is loaded."""
    rate = shmbuf.RateLimit(min_size=1000, samples_per_insert=1, error_buffer=10)
    with shmbuf.Buffer.create(X, 2000, name=name, rate=rate, seed=0) as buf:
        kill_when_there(write_rows_then_hang, (name, 10, str(tmp_path / "writing")), tmp_path / "writing",
                        "the writer to stop inside its 11th write")
        assert buf.total_added == 11 and len(buf) == 11  # (its 11th row reserved, never published)
        t0 = time.monotonic()
        with pytest.raises(shmbuf.RateLimitTimeout, match="writers must insert"):
            buf.sample(1, timeout=0.2)
        assert time.monotonic() - t0 < 30  # (a hang would take pytest's timeout)


def test_episode_buffers_keep_to_a_rate_limit(name):
    rate = shmbuf.RateLimit(min_size=4, samples_per_insert=1, error_buffer=4)
    fields = {"obs": ((1,), "float32"), "reward": ((), "float32")}
    with shmbuf.EpisodeBuffer.create(fields, 64, lanes=2, name=name, rate=rate, seed=0) as buf:
        with buf.writer(envs=2) as w:
            no = np.zeros(2, bool)
            for t in range(4):  # 8 rows: diff 8 = 4 + 4
                w.add({"obs": [[t], [t]], "reward": [1, 1]}, terminated=no, truncated=no)
            with pytest.raises(shmbuf.RateLimitTimeout):
                w.add({"obs": [[4], [4]], "reward": [1, 1]}, terminated=no, truncated=no, timeout=0.05)
            assert len(buf) == 8
            buf.sample(4)
            w.add({"obs": [[4], [4]], "reward": [1, 1]}, terminated=no, truncated=no, timeout=0.05)
            assert len(buf) == 10


def test_a_sample_at_its_deadline_still_waits_a_moment_for_the_lock(name, monkeypatch):
    """The header lock is held for microseconds: a rate-limited sample whose time is up
    still gives a holder LOCK_FLOOR to let go, and then says the rate limit held it back
    (RateLimitTimeout), never that the lock could not be had in 0 s."""
    from shmbuf.rate import limit as ratelimit

    rate = shmbuf.RateLimit(min_size=100, samples_per_insert=1.0, error_buffer=10.0)
    with shmbuf.Buffer.create({"x": ((), "int64")}, 16, name=name, rate=rate) as buf:
        buf.add({"x": 1})
        lock, asked = buf.engine.ring.lock, []
        real = lock.acquire

        def acquire(timeout):
            asked.append(timeout)
            return real(timeout)
        monkeypatch.setattr(lock, "acquire", acquire)
        with pytest.raises(shmbuf.RateLimitTimeout, match="min_size=100"):
            buf.sample(1, timeout=0)
        assert asked and min(asked) >= ratelimit.LOCK_FLOOR


# -- a sample counts when it is returned -------------------------------------------------


@pytest.fixture
def read_hook():
    """Set the read loop's test hook (``shmbuf.core.read.HOOK``); unset afterwards."""
    from shmbuf.core import read

    def set_it(hook):
        read.HOOK = hook
    yield set_it
    read.HOOK = None


def _reserve_and_stop(writer, lane, set_hook):
    """A thread writes a row into ``lane`` through ``writer`` and stops with it reserved
    (the head moved, so the rate limit counts it inserted) and unpublished (no sample can
    copy it). Returns release()."""
    import threading
    there, go = threading.Event(), threading.Event()

    def hook(point):
        if point == "reserved" and threading.current_thread() is t:
            there.set()
            go.wait(30)

    set_hook(hook)
    t = threading.Thread(target=writer.add, args=({"x": 7},), kwargs={"lane": lane})
    t.start()
    assert there.wait(30)

    def release():
        go.set()
        t.join(30)
    return release


@pytest.mark.parametrize("how", ["timeout", "ctrl-c", "value error"])
def test_a_sample_that_returns_nothing_gives_its_count_back(name, set_hook, read_hook, how):
    """The gate lets a sample of 2 through and counts it; then its read raises: it times
    out (the only row is reserved by a writer stopped before publishing it), a real
    SIGINT lands in its second round, or the lane asked for is empty (ValueError). The
    count goes back to 0: a sample counts when it is returned (Reverb's), so the writers
    may not run further ahead for it (it stayed at 2: that much more room for them)."""
    import signal
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=10)
    with shmbuf.Buffer.create(X, 8, lanes=2, name=name, rate=rate, seed=0) as buf, \
            shmbuf.Buffer.attach(name) as writer:
        release = lambda: None  # noqa: E731
        try:
            if how == "value error":
                writer.extend({"x": np.arange(3)}, lane=0)
                with pytest.raises(ValueError, match="lane 1 holds 0 rows"):
                    buf.sample_sequences(2, 1, lane=1, timeout=5)
            else:
                release = _reserve_and_stop(writer, 1, set_hook)
                if how == "ctrl-c":
                    read_hook(lambda rounds: signal.raise_signal(signal.SIGINT) if rounds == 2 else None)
                with pytest.raises(KeyboardInterrupt if how == "ctrl-c" else shmbuf.SampleTimeout):
                    buf.sample(2, timeout=0.3 if how == "timeout" else 30)
        finally:
            read_hook(None)
            release()
        inserted, sampled = buf.engine.gate.counts()
        assert sampled == 0, f"the failed sample stayed counted: {sampled} of {inserted} inserted"
        buf.sample(2)  # (and samples that are returned still count)
        assert buf.engine.gate.counts()[1] == 2


def test_a_give_back_that_cannot_take_the_lock_says_the_samples_stay_counted(name, set_hook, read_hook):
    """The read of a counted sample raises (a real SIGINT) while another handle holds the
    header lock: the give-back waits LOCK_FLOOR for it, then leaves the count as it is
    and the interrupt's note says so (it never waits out a timeout of its own)."""
    import signal
    import time
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=10)
    with shmbuf.Buffer.create(X, 8, lanes=2, name=name, rate=rate, seed=0) as buf, \
            shmbuf.Buffer.attach(name) as writer, shmbuf.Buffer.attach(name) as holder:
        release = _reserve_and_stop(writer, 1, set_hook)
        held = []

        def hook(rounds):
            if rounds == 2:
                read_hook(None)
                holder.engine.lock.acquire(30)  # (not hold(): it would hold this thread's Ctrl-C off)
                held.append(1)
                signal.raise_signal(signal.SIGINT)
        read_hook(hook)
        t0 = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt) as got:
                buf.sample(2, timeout=30)
            elapsed = time.monotonic() - t0
        finally:
            read_hook(None)
            if held:
                holder.engine.lock.release()
            release()
        said = " ".join(getattr(got.value, "__notes__", []) or [str(got.value)])
        assert "its 2 samples stay counted by the rate limit" in said, said
        assert buf.engine.gate.counts()[1] == 2
        assert elapsed < 5, elapsed  # (not the sample's 30 s)
