"""The :class:`Buffer` handle and its parts: lanes, properties, snapshots, the queue mode,
counters (one file each; :mod:`shmbuf.buffer.handle` puts them together)."""

from shmbuf.buffer.handle import DEFAULT_TIMEOUT, Buffer, LaneWriter

__all__ = ["Buffer", "DEFAULT_TIMEOUT", "LaneWriter"]
