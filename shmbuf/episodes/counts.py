"""What an episode buffer holds, counted per lane from its rows' episode fields (raw
reads, exact while no writer runs): rows, episodes, transitions, final observations.
Used by :class:`shmbuf.episodes.EpisodeBuffer`'s counts (``transition_count``,
``num_episodes``, ``lane_steps``)."""

from __future__ import annotations

from typing import Any

from shmbuf.core.layout import published
from shmbuf.episodes.rows import FINAL


def per_lane(ring: Any) -> list[tuple[int, int, int, int]]:
    """Per lane: rows, episodes with rows, episodes with a transition, final rows
    (raw reads)."""
    lo, head = ring.window_lists()
    eps, starts, flags = ring.arrays["_episode"], ring.arrays["_start"], ring.arrays["_flags"]
    lc = ring.lane_capacity
    out = []
    for lane in range(ring.lanes):
        rows = head[lane] - lo[lane]
        if rows == 0:
            out.append((0, 0, 0, 0))
            continue
        h = head[lane] - 1  # the newest published row (not one a writer is writing, or died in)
        while h > lo[lane] and ring.stamps[lane * lc + h % lc] != published(h) and head[lane] - h < 8:
            h -= 1
        unpublished = head[lane] - 1 - h
        first, last = lane * lc + lo[lane] % lc, lane * lc + h % lc
        n = max(int(eps[last]) - int(eps[first]) + 1, 0)
        live = n - bool(flags[first] & FINAL) - (not flags[last] & FINAL and starts[last] == h)
        finals = min(n, rows) - (not flags[last] & FINAL)  # (the episode of the newest row has none yet)
        out.append((rows - unpublished, min(n, rows), max(live, 0), max(finals, 0)))
    return out

