"""Ctrl-C held off while a step of the protocol must finish: :class:`Deferred`.

CPython runs a Python signal handler (``KeyboardInterrupt`` for Ctrl-C) in the main
thread only, at the next *check* of its eval loop: the start of a Python function, a
loop's jump back, the end of a call. So an interrupt can land at the start of a
``with`` statement's ``__exit__``, before the lock it should release is released, and
a live process then holds the header lock for good: every other process waits for it
until its timeout.

While a :class:`Deferred` is entered (in the main thread), the Python handler of SIGINT
(Ctrl-C) is replaced by one that only notes the signal; on exit the old handler is put
back, and a noted signal is handed to it then (``KeyboardInterrupt`` by default), after
the step is done. Threads other than the main one never get a signal's exception, so for
them it does nothing. Only SIGINT: SIGTERM and the rest kill the process by default (the
kernel then releases the lock); a program that gives them Python handlers that raise
should not raise inside shmbuf's calls. Its cost: two ``signal.signal`` calls (about
6 us here) per outermost ``Deferred``.

Steps:

1. ``__enter__`` (outermost only): install the noting handler if SIGINT's is a Python
   callable. An interrupt that lands before that is raised at once, with nothing held;
   one that lands after is noted.
2. The body runs; :attr:`Deferred.pending` tells whether a signal was noted (a caller
   may then choose to undo its step rather than finish it).
3. ``__exit__`` (outermost only): put the old handler back, then call it for each noted
   signal (raising from here: the body is done).

Examples:
    >>> with Deferred() as d:
    ...     d.pending
    False
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

_state = threading.local()  # (per thread: the depth; only the main thread installs handlers)
_noted: list[tuple[int, FrameType | None]] = []
_saved: dict[int, Any] = {}


def _note(signum: int, frame: FrameType | None) -> None:
    _noted.append((signum, frame))


class Deferred:
    """Context manager: Ctrl-C's Python handler waits until it exits (see the module).
    Nests: only the outermost one installs and restores the handler."""

    __slots__ = ("main", "entered")

    def __init__(self) -> None:
        self.main = threading.current_thread() is threading.main_thread()
        self.entered = False  # (set as the depth counts it: a caller may have to undo it)

    def __enter__(self) -> "Deferred":
        depth = getattr(_state, "depth", 0)
        _state.depth = depth + 1
        self.entered = True
        if depth == 0 and self.main:
            try:
                old = signal.signal(signal.SIGINT, _note)  # (one call: it returns the old handler)
                if callable(old) and old is not _note:
                    _saved[signal.SIGINT] = old
                else:  # SIG_IGN, SIG_DFL (the kernel's: nothing Python raises), or not Python's
                    signal.signal(signal.SIGINT, old if old is not None else signal.SIG_DFL)
            except BaseException:  # (an interrupt that landed before: nothing to hold off)
                self._restore()
                raise
        return self

    @property
    def pending(self) -> bool:
        """Whether a signal landed since the outermost ``Deferred`` was entered."""
        return bool(_noted)

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        if not self.entered:
            return
        self.entered = False
        _state.depth -= 1
        if _state.depth or not self.main:
            return
        noted = _noted[:]  # (first: a signal after the handler is back is the handler's)
        del _noted[:]
        old = _saved.pop(signal.SIGINT, None)
        if old is not None:
            signal.signal(signal.SIGINT, old)
        for signum, frame in noted:
            handler = signal.getsignal(signum)
            if callable(handler):
                handler(signum, frame)
