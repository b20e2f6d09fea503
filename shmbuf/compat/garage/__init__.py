"""garage's replay buffers over shared memory: switch with one import
(``from shmbuf.compat.garage import PathBuffer``). ``PathBuffer`` and ``HERReplayBuffer`` are in
:mod:`~shmbuf.compat.garage.paths`, ``ReplayBuffer`` in :mod:`~shmbuf.compat.garage.replay`."""

from shmbuf.compat.garage.paths import HERReplayBuffer, PathBuffer
from shmbuf.compat.garage.replay import ReplayBuffer

__all__ = ["HERReplayBuffer", "PathBuffer", "ReplayBuffer"]
