"""One deadline per call: a blocking call that crosses several stages (the rate gate,
then the read; the gate, then the header lock; a thread's hold of a lock, then another
process's) returns or raises within its ``timeout``, not within the sum of its stages'.

Each test holds the first stage until most of the timeout is gone (the gate's wait
reaches a point chosen through its test hook), then makes the second stage unable to
finish. Elapsed time is only ever an upper bound, with generous slack: the call must
end before ``1.5 * T``; a stage that started its timeout again would end at ``1.8 * T``
or later."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

import shmbuf
from shmbuf.core import ring as ring_module
from shmbuf.rate import limit as ratelimit

X = {"x": ((), "int64")}
T = 1.0  # the timeout of each call
LATE = 0.2 * T  # the gate lets the call through once less than this is left


@pytest.fixture
def hooks():
    """Set the gate's and the writers' test hooks; both unset afterwards."""
    set_to = {}

    def set_hooks(gate=None, ring=None):
        set_to.update(gate=gate, ring=ring)
        ratelimit.HOOK = gate
        ring_module.set_hook(ring)

    yield set_hooks
    ratelimit.HOOK = None
    ring_module.set_hook(None)


def stop_reserved(writer, lane):
    """Start a thread that writes a row into ``lane`` through ``writer`` and stops with it
    reserved and unpublished (the head moved: the rate limit counts it; no sample can
    copy it, and a live writer holds it: samplers wait for it). Returns (the ring hook,
    start(), release())."""
    there, go = threading.Event(), threading.Event()
    state = {}

    def ring_hook(point):
        if point == "reserved" and threading.current_thread() is state.get("thread"):
            there.set()
            go.wait(30)

    def start():
        t = state["thread"] = threading.Thread(target=writer.add, args=({"x": 7},), kwargs={"lane": lane})
        t.start()
        assert there.wait(30)

    def release():
        go.set()
        if "thread" in state:
            state["thread"].join(30)

    return ring_hook, start, release


SAMPLES = {
    "sample": (dict(), lambda buf: buf.sample(1, timeout=T)),
    "sample_sequences": (dict(), lambda buf: buf.sample_sequences(1, 1, timeout=T)),
    "sample_by_version": (dict(versions=True), lambda buf: buf.sample(1, min_version=0, timeout=T)),
}


@pytest.mark.parametrize("how", sorted(SAMPLES))
def test_a_rate_limited_sample_ends_within_its_timeout_across_the_gate_and_the_read(name, hooks, how):
    """The gate holds the sample (nothing inserted) until less than LATE is left, then a
    writer reserves a row and stops: the gate lets the sample through, and its read
    finds only that unpublished row. It raises SampleTimeout by T (it used to give the
    read a whole T of its own: 1.8 T and more)."""
    create, call = SAMPLES[how]
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=10)
    with shmbuf.Buffer.create(X, 8, lanes=2, name=name, rate=rate, seed=0, **create) as buf, \
            shmbuf.Buffer.attach(name) as writer:
        ring_hook, start, release = stop_reserved(writer if not create else _versioned(writer), 1)

        def gate_hook(what, left):
            if left < LATE and "thread" not in started:
                started["thread"] = True
                start()

        started = {}
        hooks(gate=gate_hook, ring=ring_hook)
        try:
            t0 = time.monotonic()
            with pytest.raises(shmbuf.SampleTimeout, match="could not copy") as got:
                call(buf)
            elapsed = time.monotonic() - t0
        finally:
            release()
        assert started, "the gate never reached its last part: the test did not test"
        assert elapsed < 1.5 * T, elapsed
        assert f"of timeout={T:g} s went to the rate limit's wait before it" in str(got.value)


def _versioned(writer):
    """``writer`` writing rows of version 1 (a buffer created with versions=True)."""
    class Versioned:
        def add(self, row, lane):
            writer.add(row, lane=lane, version=1)
    return Versioned()


def test_a_rate_limited_write_ends_within_its_timeout_across_the_gate_and_the_lock(name, hooks):
    """The gate holds an add (the writers are ahead) until less than LATE is left; then
    a learner samples (the gate opens) and another handle takes the header lock and
    keeps it: the add, to a shared lane, cannot reserve. It raises LockTimeout by T (it
    used to give the lock a whole T of its own)."""
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=2)  # inserted - sampled <= 3
    with shmbuf.Buffer.create(X, 8, name=name, rate=rate, seed=0) as buf, \
            shmbuf.Buffer.attach(name, seed=1) as learner, shmbuf.Buffer.attach(name) as holder:
        buf.extend({"x": np.arange(3)})
        held = {}

        def gate_hook(what, left):
            if left < LATE and not held:
                learner.sample(2)
                held["lock"] = holder.engine.lock.hold(30)
                held["lock"].__enter__()

        hooks(gate=gate_hook)
        try:
            t0 = time.monotonic()
            with pytest.raises(shmbuf.LockTimeout) as got:
                buf.add({"x": 3}, timeout=T)
            elapsed = time.monotonic() - t0
        finally:
            if held:
                held["lock"].__exit__(None, None, None)
        assert held, "the gate never reached its last part: the test did not test"
        assert elapsed < 1.5 * T, elapsed
        assert f"of timeout={T:g} s went to the rate limit's wait before it" in str(got.value)
        assert len(buf) == 3  # nothing written


def test_the_header_lock_waits_once_for_another_thread_and_another_process(name):
    """Another thread of this handle holds its lock's thread part for 0.6 T, and another
    handle (as another process would) holds the file lock all along: acquire(T) raises
    by T (it used to wait a whole T for the file lock after the thread's hold). (The
    thread lets go by a timer: late, it only makes both waits one, never a failure.)"""
    with shmbuf.Buffer.create(X, 8, name=name) as buf, shmbuf.Buffer.attach(name) as other:
        lock = buf.engine.lock
        taken, done = threading.Event(), threading.Event()

        def hold_for_a_while():
            with lock.thread_lock:  # (this handle's threads take turns on it)
                taken.set()
                done.wait(0.6 * T)

        t = threading.Thread(target=hold_for_a_while)
        try:
            with other.engine.lock.hold(30):
                t.start()
                assert taken.wait(30)
                t0 = time.monotonic()
                with pytest.raises(shmbuf.LockTimeout):
                    lock.acquire(T)
                elapsed = time.monotonic() - t0
        finally:
            done.set()
            t.join(30)
        assert elapsed < 1.5 * T, elapsed


def test_a_gate_that_opens_at_the_deadline_leaves_the_write_a_moment_for_the_lock(name, hooks):
    """The gate opens only once the deadline has passed (nothing is left): the write
    still gets LOCK_FLOOR (0.05 s) for the header lock, as the gate's own look at the
    counts does (a lock held for microseconds must not fail a write that the rate limit
    let through); here the lock stays held, so it raises LockTimeout saying so, having
    waited that floor (with no floor it would fail at once: 'within 0 s')."""
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=2)
    with shmbuf.Buffer.create(X, 8, name=name, rate=rate, seed=0) as buf, \
            shmbuf.Buffer.attach(name, seed=1) as learner, shmbuf.Buffer.attach(name) as holder:
        buf.extend({"x": np.arange(3)})
        held = {}

        def gate_hook(what, left):
            if left < LATE and not held:
                time.sleep(left + 0.01)  # past the deadline
                learner.sample(2)
                held["lock"] = holder.engine.lock.hold(30)
                held["lock"].__enter__()

        hooks(gate=gate_hook)
        try:
            t0 = time.monotonic()
            with pytest.raises(shmbuf.LockTimeout, match=r"header lock within (\S+) s") as got:
                buf.add({"x": 3}, timeout=T)
            elapsed = time.monotonic() - t0
        finally:
            if held:
                held["lock"].__exit__(None, None, None)
        assert held, "the gate never reached its last part: the test did not test"
        assert f"s of timeout={T:g} s went to the rate limit's wait before it" in str(got.value)
        waited = float(re.search(r"header lock within (\S+) s", str(got.value)).group(1))
        assert 0 < waited <= 0.05, waited  # (no floor: "within 0 s")
        assert elapsed < 1.5 * T, elapsed


def test_claiming_several_lanes_ends_within_one_timeout(name):
    """claim_many (an episode writer's or the SB3 facade's envs, a lane each): the first
    claim's wait for the lock takes 0.8 T (made so here), then another handle keeps the
    lock: the second claim gets what is left, and the whole call raises by T (each
    claim used to get a whole T, and so did giving back the first: 2.8 T)."""
    with shmbuf.Buffer.create(X, 9, lanes=3, name=name) as buf, shmbuf.Buffer.attach(name) as holder:
        ring = buf.engine.ring
        real, calls, held = ring.lock.hold, [], []

        def hold(timeout):
            calls.append(timeout)
            if len(calls) == 1:
                time.sleep(0.8 * T)  # (as a contended wait that ends in time)
            elif not held:
                held.append(holder.engine.lock.hold(30))
                held[0].__enter__()
            return real(timeout)

        ring.lock.hold = hold
        try:
            t0 = time.monotonic()
            with pytest.raises(shmbuf.LockTimeout):
                ring.claim_many(3, T)
            elapsed = time.monotonic() - t0
        finally:
            del ring.lock.hold
            if held:
                held[0].__exit__(None, None, None)
        assert len(calls) >= 2 and elapsed < 1.5 * T, (calls, elapsed)


# -- calls of several lock waits (saves, loads, flushes, restores, a writer's lanes) ------


class SlowThenHeld:
    """Every header lock's ``hold`` of this process, patched: the first wait takes 0.8 T
    (as a contended wait that ends in time), and from the second on another handle
    (``attach()``: on the buffer being tested) holds the lock and keeps it until
    :meth:`release`. A call whose stages each waited their whole timeout ends at 1.8 T
    or later; one deadline for all of them ends it by T (plus LOCK_FLOOR)."""

    def __init__(self, monkeypatch, attach):
        from shmbuf.core.lock import HeaderLock
        real, self.calls, self.holder, self.busy = HeaderLock.hold, [], None, False

        def hold(lock, timeout):
            if self.busy or lock is getattr(self.holder, "lock", None):
                return real(lock, timeout)
            self.calls.append(timeout)
            if len(self.calls) == 1:
                time.sleep(0.8 * T)
            elif self.holder is None:
                self.busy = True
                try:
                    self.holder = attach().engine
                finally:
                    self.busy = False
                self.holder.lock.acquire(30)  # (not hold(): it would hold this thread's Ctrl-C off)
            return real(lock, timeout)
        monkeypatch.setattr(HeaderLock, "hold", hold)

    def release(self):
        if self.holder is not None:
            self.holder.lock.release()
            self.holder.close()
            self.holder = None

    def ends_in_time(self, call, error=shmbuf.LockTimeout):
        """Run ``call()``: it raises ``error`` before 1.5 T, having met both stages."""
        t0 = time.monotonic()
        try:
            with pytest.raises(error) as got:
                call()
            elapsed = time.monotonic() - t0
        finally:
            self.release()
        assert len(self.calls) >= 2, f"the call met {len(self.calls)} wait(s): the test did not test"
        assert elapsed < 1.5 * T, (elapsed, self.calls)
        return got.value


def test_a_flush_waits_for_the_lock_twice_within_one_timeout(tmp_path, monkeypatch):
    """flush of a buffer file: the lock for the frontiers (0.8 T), the disk, then the lock
    held to record them: LockTimeout by T (each wait had the whole timeout: 1.8 T)."""
    path = str(tmp_path / "b.shmbuf")
    with shmbuf.Buffer.create(X, 8, path=path) as buf:
        buf.extend({"x": np.arange(3)})
        slow = SlowThenHeld(monkeypatch, lambda: shmbuf.Buffer.attach(path))
        slow.ends_in_time(lambda: buf.flush(timeout=T))
        monkeypatch.undo()
        buf.flush()  # (and a flush that is let through works)
        buf.unlink()


@pytest.mark.parametrize("where", ["file", "queue"])
def test_a_restore_and_what_follows_it_wait_within_one_timeout(tmp_path, name, monkeypatch, where):
    """load_state_dict: the restore's lock (0.8 T), the copy, then the lock held for what
    follows it (a buffer file's flush of the restored rows; a queue's reset of its
    takes): LockTimeout by T (the flush had what was left plus 1 s; the reset a whole T)."""
    kw = {"path": str(tmp_path / "b.shmbuf")} if where == "file" else {"name": name, "mode": "queue"}
    with shmbuf.Buffer.create(X, 8, **kw) as buf:
        buf.extend({"x": np.arange(3)})
        state = buf.state_dict()
        slow = SlowThenHeld(monkeypatch, lambda: shmbuf.Buffer.attach(buf.name))
        got = slow.ends_in_time(lambda: buf.load_state_dict(state, timeout=T))
        if where == "file":
            assert "the rows were restored; the flush that puts them on the disk did not finish" in str(got)
        buf.unlink()


def test_a_save_waits_for_the_priorities_and_the_lock_within_one_timeout(tmp_path, name, monkeypatch):
    """save of a prioritized buffer whose trees keep changing (each chunk of leaves read
    under the lock: 0.8 T), then the lock held for the lane positions: LockTimeout by T
    (the positions had a whole T of their own), and no save is left behind."""
    from shmbuf.priority import trees
    with shmbuf.Buffer.create(X, 8, name=name, priority=0.6) as buf:
        buf.extend({"x": np.arange(3)})
        monkeypatch.setattr(trees, "read_stable", lambda version, read: (False, None))
        slow = SlowThenHeld(monkeypatch, lambda: shmbuf.Buffer.attach(name))
        slow.ends_in_time(lambda: buf.save(tmp_path / "save", timeout=T))
        assert not (tmp_path / "save").exists()


def test_a_load_waits_within_one_timeout(tmp_path, name, monkeypatch):
    """Buffer.load of a rate-limited save: the new buffer's first wait for its lock takes
    0.8 T, then the lock stays held (for the restore, or the rate limit's counts after
    it): LockTimeout by T, and the buffer made is removed."""
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=10)
    with shmbuf.Buffer.create(X, 8, name=name, rate=rate, seed=0) as buf:
        buf.extend({"x": np.arange(3)})
        buf.save(tmp_path / "save")
    copy = f"{name}-copy"
    slow = SlowThenHeld(monkeypatch, lambda: shmbuf.Buffer.attach(copy))
    slow.ends_in_time(lambda: shmbuf.Buffer.load(tmp_path / "save", name=copy, timeout=T))
    with pytest.raises(FileNotFoundError):
        shmbuf.Buffer.attach(copy, timeout=0)


def test_an_episode_writer_gives_its_lanes_back_within_one_timeout(name, monkeypatch):
    """close() of a writer of 3 envs: the first lane's release waits 0.8 T, then the lock
    stays held: LockTimeout by T (each release had a whole T: 1.8 T and more), and the
    lanes not given back stay the writer's, for the next close."""
    with shmbuf.EpisodeBuffer.create({"obs": ((), "float32")}, 12, lanes=3, name=name) as buf:
        writer = buf.writer(3)
        slow = SlowThenHeld(monkeypatch, lambda: shmbuf.EpisodeBuffer.attach(name))
        slow.ends_in_time(lambda: writer.close(timeout=T))
        monkeypatch.undo()
        assert len(writer.lanes) == 2
        writer.close()
        assert writer.lanes == [] and buf.core.stats()["lanes"][0]["claimed_by"] is None


def test_an_episode_buffers_first_add_claims_and_writes_within_one_timeout(name, monkeypatch):
    """EpisodeBuffer.add makes the handle's own writer at its first step: the claim of its
    lane waits 0.8 T, then the rate limit holds the write (the writers are ahead):
    RateLimitTimeout by T, and the lane is given back (the claim had the handle's
    default timeout, 10 s, and the write a whole T after it)."""
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=2)
    with shmbuf.EpisodeBuffer.create({"obs": ((), "float32")}, 16, lanes=2, name=name, rate=rate) as buf:
        with buf.writer() as w:
            for t in range(3):
                w.add({"obs": t}, terminated=False, truncated=False)
        slow = SlowThenHeld(monkeypatch, lambda: shmbuf.EpisodeBuffer.attach(name))
        slow.ends_in_time(lambda: buf.add({"obs": 9.0}, terminated=False, truncated=False, timeout=T),
                          error=shmbuf.RateLimitTimeout)
        monkeypatch.undo()
        buf.release_lane()
        assert [d["claimed_by"] for d in buf.core.stats()["lanes"]] == [None, None]


def test_an_attach_after_a_restart_waits_within_one_timeout(tmp_path, monkeypatch):
    """The first attach of a queue's file after a restart of the machine rolls it back
    and gives the takes in flight back (from the queue's snapshot,
    :mod:`shmbuf.queue.restart`) in one wait for the lock (0.8 T here), and the lock,
    held by another handle from then on, holds up nothing after it: the attach returns
    by T. (Before the snapshot, the give-back was a wait of its own, after the
    rollback's, with a whole T: 1.8 T.)"""
    from shmbuf.core import durable
    from shmbuf.core.layout import CTRL_BOOT
    path = str(tmp_path / "q.shmbuf")
    buf = shmbuf.Buffer.create(X, 8, path=path, mode="queue")
    buf.extend({"x": np.arange(3)})
    buf.flush()
    buf.engine.ring.control[CTRL_BOOT] = durable.boot_id() ^ 0x5A5A  # (as a restart leaves it)
    buf.close()
    slow = SlowThenHeld(monkeypatch, lambda: shmbuf.Buffer.observe(path))
    t0 = time.monotonic()
    try:
        attached = shmbuf.Buffer.attach(path, timeout=T)
        elapsed = time.monotonic() - t0
    finally:
        slow.release()
    assert len(slow.calls) >= 1, slow.calls
    assert elapsed < 1.5 * T, (elapsed, slow.calls)
    attached.close()
    monkeypatch.undo()
    with shmbuf.Buffer.attach(path) as again:
        assert len(again) == 3
        again.unlink()
