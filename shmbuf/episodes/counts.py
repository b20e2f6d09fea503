"""What an :class:`~shmbuf.episodes.buffer.EpisodeBuffer` counts: transitions, steps
per lane, episodes, rows, and the shared counters."""

from __future__ import annotations

from typing import Any

from shmbuf.core.engine import Engine
from shmbuf.episodes import gather


class Counts:
    """The counts of an episode buffer (a part of :class:`~shmbuf.episodes.buffer.EpisodeBuffer`)."""

    engine: Engine
    core: Any

    @property
    def transition_count(self) -> int:
        """Transitions that can be sampled now (about, while writers run): in each lane,
        its rows less one per episode (an episode's final row, or the newest step of
        one in progress, is not a transition)."""
        return sum(rows - eps for rows, eps, _, _ in self._lanes())

    def lane_steps(self) -> list[int]:
        """Per lane, the steps stored (about, while writers run): its rows less the final
        observations of the episodes that ended (SB3's count of transitions: the newest
        step of an episode in progress counts).

        Examples:
            >>> import numpy as np, shmbuf
            >>> eb = shmbuf.EpisodeBuffer.create({"obs": ((), "float32")}, 16)
            >>> eb.add_episode({"obs": np.arange(3, dtype=np.float32), "next_obs": np.arange(1, 4, dtype=np.float32)})
            >>> len(eb), eb.lane_steps()
            (4, [3])
            >>> eb.close()
        """
        return [rows - finals for rows, _, _, finals in self._lanes()]

    @property
    def num_episodes(self) -> int:
        """Episodes with at least one transition left (d3rlpy's ``size()``): partly
        evicted ones and the ones in progress count; whole-episode samples take only
        the complete ones."""
        return sum(live for _, _, live, _ in self._lanes())

    def _lanes(self) -> list[tuple[int, int, int, int]]:
        return gather.per_lane(self.engine.ring)

    def __len__(self) -> int:
        """Rows stored (steps and final observations)."""
        return len(self.core)

    @property
    def total_added(self) -> int:
        """Rows ever added, as :func:`len` counts them (steps and final observations),
        by every process since creation."""
        return self.core.total_added

    def stats(self) -> dict[str, Any]:
        """The buffer's counters from every process (see :meth:`shmbuf.Buffer.stats`).

        Examples:
            >>> import numpy as np, shmbuf
            >>> eb = shmbuf.EpisodeBuffer.create({"obs": ((2,), np.float32)}, 64)
            >>> eb.add_episode({"obs": np.zeros((4, 2), np.float32), "next_obs": np.ones((4, 2), np.float32)})
            >>> _ = eb.sample(8); s = eb.stats()
            >>> s["rows_inserted"] == eb.total_added == 5, s["rows_sampled"], s["torn_read_retries"]
            (True, 8, 0)
            >>> eb.close()
        """
        return self.core.stats()
