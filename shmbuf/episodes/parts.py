"""What the episode samplers, the writer and HER use of an episode buffer: the
:class:`Episodes` protocol (``EpisodeBuffer`` is one). Typed against this, they need
not import the buffer that imports them.
"""

from __future__ import annotations

from typing import Any, Protocol

from shmbuf.core.engine import Engine
from shmbuf.episodes.rows import StepRows


class Episodes(Protocol):
    """An episode buffer, as its parts see it."""

    engine: Engine  # the handle's engine: ring, RNG, timeouts, gates
    core: Any  # the shmbuf.Buffer it is built on
    observations: list[str]  # observation fields (each with a next_<obs>)
    reward: str | None  # the reward field, if any (n-step sums, returns-to-go)
    frame_stack: int
    step_rows: StepRows  # how a step's fields map to stored rows
    user_fields: dict[str, Any]  # the fields a user gave, without the system ones
    apart: list[str]  # observation fields read apart from the rest of a row
    transitions: Any  # the transition sampler's state (shmbuf.episodes.transitions.Sampler)
    episode_index: Any  # the complete episodes found so far (shmbuf.episodes.whole.Index)

    @property
    def lane_capacity(self) -> int: ...

    def episode_ends(self) -> Any: ...
