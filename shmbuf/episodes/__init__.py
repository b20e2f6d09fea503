"""Episodes in shared memory: :class:`EpisodeBuffer` and its writers.

* ``rows.py``: what a row holds (steps, final observations, the episode's identity);
* ``writer.py``: :class:`EpisodeWriter`, one lane per env;
* ``gather.py``: stamp-checked reads of named fields, frame stacks;
* ``transitions.py``: one-step and n-step transitions;
* ``trajectories.py``: windows of one episode ending at a sampled step;
* ``whole.py``: whole episodes, and the index that finds them;
* ``buffer.py``: :class:`EpisodeBuffer`.
"""

from shmbuf.episodes.buffer import EpisodeBuffer
from shmbuf.episodes.writer import EpisodeWriter

__all__ = ["EpisodeBuffer", "EpisodeWriter"]
