"""Ctrl-C held off while a step of the protocol must finish: :class:`Deferred`.

CPython runs a Python signal handler (``KeyboardInterrupt`` for Ctrl-C) in the main
thread only, at the next *check* of its eval loop: the start of a Python function, a
loop's jump back, the end of a call. So an interrupt can land at the start of a
``with`` statement's ``__exit__``, before the lock it should release is released, and
a live process then holds the header lock for good: every other process waits for it
until its timeout.

While a :class:`Deferred` is entered (in the main thread), the Python handlers of
SIGINT and SIGTERM are replaced by one that only notes the signal; on exit the old
handlers are put back, and a noted signal is handed to its old handler then (which
raises ``KeyboardInterrupt`` for Ctrl-C), after the step is done. Threads other than
the main one never get a signal's exception, so for them it does nothing.

Steps:

1. ``__enter__`` (outermost only): for each signal whose handler is a Python callable,
   install the noting handler. An interrupt that lands before that is raised at once,
   with nothing held; one that lands after is noted.
2. The body runs; :attr:`Deferred.pending` tells whether a signal was noted (a caller
   may then choose to undo its step rather than finish it).
3. ``__exit__`` (outermost only): put every old handler back, then call the old
   handler of each noted signal (raising from here: the body is done).

Example:
    >>> with Deferred() as d:
    ...     d.pending
    False
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_state = threading.local()  # (per thread: the depth; only the main thread installs handlers)
_noted: list[tuple[int, FrameType | None]] = []
_saved: dict[int, Any] = {}


def _note(signum: int, frame: FrameType | None) -> None:
    _noted.append((signum, frame))


class Deferred:
    """Context manager: signals' Python handlers wait until it exits (see the module).
    Nests: only the outermost one installs and restores handlers."""

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
                for sig in SIGNALS:
                    old = signal.getsignal(sig)
                    if callable(old) and old is not _note:
                        _saved[sig] = old
                        signal.signal(sig, _note)
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
        saved = dict(_saved)
        _saved.clear()
        try:  # (no function call in between: a restored handler may raise at the next check)
            if signal.SIGTERM in saved:
                signal.signal(signal.SIGTERM, saved[signal.SIGTERM])
        finally:
            if signal.SIGINT in saved:
                signal.signal(signal.SIGINT, saved[signal.SIGINT])
        noted = _noted[:]
        del _noted[:]
        for signum, frame in noted:
            handler = signal.getsignal(signum)
            if callable(handler):
                handler(signum, frame)
