"""Episodes in shared memory: :class:`EpisodeBuffer` and its writers.

* ``rows.py``: what a row holds (steps, final observations, the episode index);
* ``writer.py``: :class:`EpisodeWriter`, one lane per env;
* ``transitions.py``: one-step and n-step transitions;
* ``buffer.py``: :class:`EpisodeBuffer`.
"""

from .buffer import EpisodeBuffer
from .writer import EpisodeWriter

__all__ = ["EpisodeBuffer", "EpisodeWriter"]
