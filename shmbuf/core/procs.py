"""Who is this process, and is that one still alive?

A process is identified by its pid **and** its start time, so a pid the kernel has
reused for another process is not mistaken for the original (psutil reads the start
time from ``/proc``). A zombie (killed, not yet reaped by its parent) counts as dead.

Limit: all processes sharing a buffer must see each other's pids, i.e. live in the
same pid namespace (containers sharing ``/dev/shm`` with ``--ipc=host`` but not
``--pid=host`` do not).
"""

from __future__ import annotations

import os
import time

import psutil

_me: tuple[int, float] | None = None


def identity() -> tuple[int, float]:
    """``(pid, start_time)`` of the calling process (cached; renewed after fork)."""
    global _me
    if _me is None:
        pid = os.getpid()
        _me = (pid, psutil.Process(pid).create_time())
    return _me


def _forget_identity() -> None:
    global _me
    _me = None


os.register_at_fork(after_in_child=_forget_identity)


def is_alive(pid: int, start_time: float) -> bool:
    """True if process ``pid`` that started at ``start_time`` still runs (or may: when
    the system will not say, it is assumed alive)."""
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - start_time) > 0.005:  # a new process reusing the pid
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


class Liveness:
    """:func:`is_alive` with a memory for loops that ask again and again.

    A dead process stays dead (a pid and start time never come back), so that answer
    is kept; "alive" is asked again once it is ``refresh`` seconds old, so a process
    killed while someone waits on it is noticed within that time.
    """

    def __init__(self, refresh: float = 0.002) -> None:
        self._refresh = refresh
        self._dead: set[tuple[int, float]] = set()
        self._alive: dict[tuple[int, float], float] = {}

    def __call__(self, pid: int, start_time: float) -> bool:
        who = (pid, start_time)
        if who in self._dead:
            return False
        now = time.monotonic()
        if now - self._alive.get(who, -1e9) < self._refresh:
            return True
        if is_alive(pid, start_time):
            self._alive[who] = now
            return True
        self._dead.add(who)
        self._alive.pop(who, None)
        return False
