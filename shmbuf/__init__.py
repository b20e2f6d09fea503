"""shmbuf: a replay buffer in shared memory that many processes write and sample at once.

Example:
    >>> import numpy as np, shmbuf
    >>> with shmbuf.Buffer.create({"obs": ((4,), np.float32)}, capacity=8, seed=0) as buf:
    ...     buf.extend({"obs": np.ones((3, 4))})
    ...     buf.sample(2)["obs"].shape
    (2, 4)
"""

from .actors import Actor, Actors
from .buffer import DEFAULT_TIMEOUT, Buffer, LaneWriter
from .episodes import EpisodeBuffer, EpisodeWriter
from .her import HER
from .core.layout import FormatError
from .core.lock import LockTimeout
from .core.ratelimit import RateLimit, RateLimitTimeout
from .core.ring import WriteTimeout
from .core.read import SampleTimeout
from .core.segment import ShmSpaceError
from .spaces import fields_from_spaces
from .version import __version__  # noqa: F401
from .weights import Weights

__all__ = ["Buffer", "LaneWriter", "Actors", "Actor", "EpisodeBuffer", "EpisodeWriter", "HER", "RateLimit", "RateLimitTimeout",
           "Weights", "fields_from_spaces", "DEFAULT_TIMEOUT", "FormatError", "LockTimeout", "WriteTimeout", "SampleTimeout", "ShmSpaceError"]
