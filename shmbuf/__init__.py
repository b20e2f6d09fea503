"""shmbuf: a replay buffer in shared memory that many processes write and sample at once.

Examples:
    >>> import numpy as np, shmbuf
    >>> with shmbuf.Buffer.create({"obs": ((4,), np.float32)}, capacity=8, seed=0) as buf:
    ...     buf.extend({"obs": np.ones((3, 4))})
    ...     buf.sample(2)["obs"].shape
    (2, 4)
"""

from shmbuf.actors.processes import Actor, Actors
from shmbuf.buffer.handle import DEFAULT_TIMEOUT, Buffer, LaneWriter
from shmbuf.episodes import EpisodeBuffer, EpisodeWriter
from shmbuf.episodes.her import HER
from shmbuf.core.layout import FormatError
from shmbuf.core.lock import LockTimeout
from shmbuf.rate.limit import RateLimit, RateLimitTimeout
from shmbuf.core.ring import WriteTimeout
from shmbuf.core.read import SampleTimeout
from shmbuf.core.segment import ShmSpaceError
from shmbuf.core.native import PurePythonWarning, path as implementation
from shmbuf.core.pool import limit as pool_limit
from shmbuf.spaces import fields_from_spaces
from shmbuf.version import __version__  # noqa: F401
from shmbuf.actors.weights import Weights
from shmbuf.ragged.jagged import Jagged

__all__ = ["Buffer", "LaneWriter", "Actors", "Actor", "EpisodeBuffer", "EpisodeWriter", "HER", "RateLimit", "RateLimitTimeout",
           "Weights", "Jagged", "fields_from_spaces", "DEFAULT_TIMEOUT", "FormatError", "LockTimeout", "WriteTimeout", "SampleTimeout", "ShmSpaceError",
           "PurePythonWarning", "implementation", "pool_limit"]
