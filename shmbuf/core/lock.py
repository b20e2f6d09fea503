"""The header lock: a cross-process mutex the kernel releases when its holder dies.

It is ``flock(LOCK_EX)`` on a descriptor of the segment that this handle opened
itself, plus a ``threading.Lock`` for the threads of one process (flock locks belong
to an open file description, which threads share).

Why not ``multiprocessing.Lock``: it cannot be opened by name from an unrelated
process, and it has no owner, so a holder killed by SIGKILL keeps it locked forever.
A flock is released by the kernel when the last descriptor of its open file
description closes, which process death does.

The fork trap: a forked child shares its parent's open file descriptions. If the
child locked the parent's descriptor, killing the parent while it holds the lock
would not release it. So the descriptor is the segment handle's own, which a forked
child replaces by a new one (``Segment`` does that at fork); the lock reads it at each
acquire.

**Ctrl-C.** ``KeyboardInterrupt`` can be raised at the start of any Python function and
at the end of any call, also right after ``flock`` returned or as a ``with`` block's
``__exit__`` begins. ``acquire`` either returns with both locks held or raises with
neither (unlocking an flock one does not hold is a no-op, so its error path always
unlocks); ``release`` releases the thread lock whatever happens to the flock. And
:meth:`HeaderLock.hold` holds signals' Python handlers off (:mod:`shmbuf.core.interrupts`)
from before it takes the lock to after it released it: an interrupt that lands while
it is held is raised once the lock is free. A notebook that catches the interrupt and
goes on never leaves the buffer locked, nor do the hot paths that inline the release
(``Ring.put``: no call between the end of the work and the ``flock`` that unlocks).

Acquisition polls with a short backoff up to a deadline, so every acquire takes a
timeout; the critical sections it guards are a few microseconds long.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import weakref
from typing import Any, Callable

import numpy as np

from shmbuf.core.interrupts import Deferred

_live: "weakref.WeakSet[HeaderLock]" = weakref.WeakSet()


class LockTimeout(TimeoutError):
    """The header lock could not be taken in time."""


class HeaderLock:
    """Cross-process, crash-safe, thread-safe mutex on a segment.

    ``fileno`` returns this handle's own descriptor on the segment (its own open file
    description; -1 once closed); ``note_holder`` records the holder's pid in the header
    for diagnostics, ``describe_holder`` reads it back for error messages.

    Examples:
        >>> import tempfile; f = tempfile.TemporaryFile(); fd = f.fileno()
        >>> lock = HeaderLock(lambda: fd)
        >>> with lock.hold(timeout=1.0):
        ...     pass
        >>> f.close()
    """

    def __init__(self, fileno: Callable[[], int], note_holder: Callable[[int], None] | None = None,
                 describe_holder: Callable[[], str] | None = None) -> None:
        self.fileno = fileno
        self._note = note_holder
        self._describe = describe_holder
        self._pid = os.getpid()
        self.thread_lock = threading.RLock()  # never re-entered: RLock for its owner test
        self.held_fd = -1
        # 1 while a thread of this process holds or is taking the lock: the native path
        # (which holds the GIL from its flock to its unlock) must not take the flock of
        # the same open file description then, which would succeed at once
        self.busy = np.zeros(1, np.int64)
        self.stats: Any = None  # a shmbuf.core.counters.Counters: acquisitions and time waited are counted
        _live.add(self)

    def acquire(self, timeout: float) -> None:
        """Take the lock or raise :class:`LockTimeout` after ``timeout`` seconds."""
        tl = self.thread_lock
        fd = -1
        t0 = time.monotonic()  # (one deadline: the wait for another thread's hold counts too)
        try:
            if not tl.acquire(False) and not tl.acquire(timeout=min(max(timeout, 0.0), 1e9)):
                raise self.timeout_error(timeout)
            self.busy[0] = 1
            self.held_fd = fd = self.fileno()
            if fd < 0:
                raise ValueError("the buffer handle is closed")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                waited = 0.0
            except BlockingIOError:
                t1 = time.monotonic()
                self._wait(fd, t0 + timeout, timeout)
                waited = time.monotonic() - t1
            if self._note is not None:
                self._note(self._pid)
            if self.stats is not None:
                slot = self.stats.slot
                slot[5] += 1  # stats.S_LOCKS, S_LOCK_NS
                if waited:
                    slot[6] += int(waited * 1e9)
        except BaseException:
            if tl._is_owned():  # this thread took it (an interrupt may have fallen right after)
                try:
                    if fd >= 0:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                finally:
                    self.busy[0] = 0
                    tl.release()
            raise

    def _wait(self, fd: int, deadline: float, timeout: float) -> None:
        """Contended. The holder keeps the lock for microseconds, so first retry at once
        (a few microseconds), then yield the CPU (its holder may need it: 2 cores, 3
        processes), and only then sleep, growing to 1 ms, until the deadline."""
        spins = 0
        delay = 20e-6
        while True:
            spins += 1
            if spins > 64:
                if time.monotonic() >= deadline:
                    raise self.timeout_error(timeout)
                if spins > 128:
                    time.sleep(delay)
                    delay = min(delay * 2, 1e-3)
                else:
                    os.sched_yield() if hasattr(os, "sched_yield") else time.sleep(0)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass

    def release(self) -> None:
        """Release; the thread lock is released even if an interrupt falls in between.
        (Hot paths inline these two calls: see ``Ring.put``.)"""
        try:
            fcntl.flock(self.held_fd, fcntl.LOCK_UN)
        finally:
            self.busy[0] = 0
            self.thread_lock.release()

    def hold(self, timeout: float) -> "_Held":
        """Context manager: ``with lock.hold(timeout): ...``; signals' Python handlers
        (Ctrl-C) wait until the lock is released (see the module)."""
        return _Held(self, timeout)

    def timeout_error(self, timeout: float) -> LockTimeout:
        who = f" ({self._describe()})" if self._describe is not None else ""
        return LockTimeout(
            f"could not take the buffer's header lock within {timeout:g} s{who}. The lock is "
            "held only for microseconds by a live process (a dead holder's lock is released "
            "by the kernel), so the machine is overloaded or a process is stopped (SIGSTOP, "
            "a debugger); pass a larger timeout= or find the holder"
        )

    def after_fork_in_child(self) -> None:
        self.thread_lock = threading.RLock()
        self.held_fd = -1
        self.busy[0] = 0
        self._pid = os.getpid()


class _Held:
    __slots__ = ("_lock", "_timeout", "_defer")

    def __init__(self, lock: HeaderLock, timeout: float) -> None:
        self._lock = lock
        self._timeout = timeout
        self._defer = Deferred()

    def __enter__(self) -> None:
        d = self._defer
        try:
            d.__enter__()  # (an interrupt that landed before it is raised here: undone below)
            self._lock.acquire(self._timeout)
        except BaseException:
            d.__exit__()  # (a no-op unless it was entered)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self._lock.release()
        finally:
            self._defer.__exit__()


def _reset_all_in_child() -> None:
    for lock in list(_live):
        lock.after_fork_in_child()


os.register_at_fork(after_in_child=_reset_all_in_child)


_OWNER_LOCKS: "weakref.WeakValueDictionary[Any, Any]" = weakref.WeakValueDictionary()


def owner_lock(lock: HeaderLock) -> Any:
    """The lock that serialises this process's threads writing a lane it owns (pure-Python
    path; the native path holds the GIL instead), one per segment for all its handles."""
    try:
        ident = os.fstat(lock.fileno()).st_ino
    except OSError:
        return ThreadLock()
    found = _OWNER_LOCKS.get(ident)
    if found is None:
        found = _OWNER_LOCKS[ident] = ThreadLock()
    return found


class ThreadLock:
    """``threading.RLock`` that can be weakly referenced, and is new in a forked child."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        lock = threading.RLock()
        self.acquire, self.release = lock.acquire, lock.release
        self.is_owned = lock._is_owned  # type: ignore[attr-defined]  # (RLock's own test)


os.register_at_fork(after_in_child=lambda: [lk.reset() for lk in list(_OWNER_LOCKS.values())])
