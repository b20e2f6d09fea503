"""The seqlock read: data read between two equal, even values of a version word that a
writer makes odd while it changes the data and even again after (so a reader needs no
lock, and sees either the data before a change or after it, never a mix).

Examples:
    >>> import numpy as np
    >>> version, data = np.zeros(1, np.int64), np.arange(3)
    >>> read_stable(lambda: int(version[0]), data.copy)
    (True, array([0, 1, 2]))
"""

from __future__ import annotations

import time
from typing import Any, Callable


def read_stable(version: Callable[[], int], read: Callable[[], Any], *, tries: int = 100,
                pause: float = 20e-6) -> tuple[bool, Any]:
    """``(True, read())`` from a try during which ``version()`` stayed the same even
    value; ``(False, the last read or None)`` after ``tries`` tries (the caller then
    takes the writers' lock, or settles for what it got)."""
    got = None
    for _ in range(tries):
        v = version()
        if v & 1:
            time.sleep(pause)
            continue
        got = read()
        if version() == v:
            return True, got
    return False, got
