"""d3rlpy's ``FIFOBuffer`` and ``InfiniteBuffer`` (behaviour of d3rlpy 2.8.1).

Both are buffers in their own right, as in d3rlpy: ``append(episode, index)`` stores a
transition (a reference to its episode and its index there), ``transition_count`` and
``len()`` count them, ``buf[i]`` is ``(episode, index)``, ``episodes`` lists the episodes
with a transition held, oldest first. A ``FIFOBuffer`` keeps the newest ``limit``
transitions: each append past ``limit`` drops the oldest, and an episode leaves
``episodes`` with its last transition.

Passed to :class:`shmbuf.compat.d3rlpy.ReplayBuffer`, they say how its shared memory
behaves: a ``FIFOBuffer(limit)`` replay buffer keeps the newest ``limit`` transitions
(per appending process), an ``InfiniteBuffer`` never evicts.

Examples:
    >>> fifo = FIFOBuffer(limit=2)
    >>> a, b = object(), object()
    >>> fifo.append(a, 0); fifo.append(a, 1); fifo.append(b, 0)
    >>> fifo.transition_count, fifo[0] == (a, 1), fifo.episodes == [a, b]
    (2, True, True)
"""

from __future__ import annotations

from collections import deque
from typing import Any, Optional

import numpy as np


class InfiniteBuffer:
    """Every transition appended stays. ``limit`` (an extension of d3rlpy's, which has
    none) sizes a replay buffer's shared memory: it holds that many transitions (default:
    those of its ``episodes``, or 1,000,000) and refuses an append past them."""

    def __init__(self, limit: Optional[int] = None) -> None:
        if limit is not None:
            limit = _check_limit(limit)
        self.limit = limit
        self._transitions: list[tuple[Any, int]] = []
        self._episodes: list[Any] = []

    def append(self, episode: Any, index: int) -> None:
        self._transitions.append((episode, index))
        if not self._episodes or episode is not self._episodes[-1]:
            self._episodes.append(episode)

    @property
    def episodes(self) -> list[Any]:
        return self._episodes

    @property
    def transition_count(self) -> int:
        return len(self._transitions)

    def __len__(self) -> int:
        return len(self._transitions)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self._transitions[index]


class FIFOBuffer(InfiniteBuffer):
    """The newest ``limit`` transitions (any ``limit >= 1``; d3rlpy's fails at 1)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit: int = int(limit)
        self._transitions: deque[tuple[Any, int]] = deque()  # type: ignore[assignment]

    @property
    def _limit(self) -> int:  # (d3rlpy's attribute name)
        return self.limit

    def append(self, episode: Any, index: int) -> None:
        if len(self._transitions) == self.limit:
            dropped = self._transitions.popleft()[0]
            after = self._transitions[0][0] if self._transitions else episode
            if dropped is not after:  # its last transition went: the episode goes
                self._episodes.pop(0)
        super().append(episode, index)


def _check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
        raise ValueError(f"limit must be an int >= 1 (transitions), got {limit!r}")
    return int(limit)


def kind_of(buffer: Any) -> tuple[str, Optional[int]]:
    """("fifo" or "infinite", limit in transitions) of ours or d3rlpy's buffer object,
    which must hold nothing yet (a replay buffer keeps its transitions in shared memory)."""
    kind = type(buffer).__name__
    if kind not in ("FIFOBuffer", "InfiniteBuffer") or not hasattr(buffer, "transition_count"):
        raise TypeError(f"buffer must be a FIFOBuffer(limit) or an InfiniteBuffer(), got {kind}")
    if buffer.transition_count:
        raise ValueError(f"the {kind} passed holds {buffer.transition_count} transitions: pass an empty one "
                         "(and the episodes as episodes=[...]); the replay buffer keeps its transitions in "
                         "shared memory")
    limit = getattr(buffer, "limit", getattr(buffer, "_limit", None))
    if kind == "FIFOBuffer":
        return "fifo", _check_limit(limit)
    return "infinite", None if limit is None else _check_limit(limit)
