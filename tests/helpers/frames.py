"""Child-process code of tests/core/test_streamed.py: frames (large rows) written with
streamed stores."""

from __future__ import annotations

import numpy as np

import shmbuf

from .processes import pause_at

FRAME = 4100  # bytes a row: not a multiple of 16, so rows start at every alignment
ROWS = 16_400  # FRAME * ROWS > 64 MiB: the native path streams these frames


def frames(first: int, n: int) -> dict:
    """Rows ``first .. first + n``: ``i`` the sequence number, every byte of the frame ``i % 251``."""
    i = np.arange(first, first + n, dtype=np.int64)
    return {"frame": np.repeat((i % 251).astype(np.uint8)[:, None], FRAME, axis=1), "i": i}


def consistent(batch: dict) -> bool:
    """Whether every row's frame is the one its ``i`` was written with."""
    return bool((batch["frame"] == (batch["i"] % 251).astype(np.uint8)[:, None]).all())


def write_frames_paused(name: str, first: int, n: int, flag: str, go: str) -> None:
    """Extend rows ``first .. first + n``, paused at "writing" (the frames copied, ``i``
    not yet) until ``go`` exists."""
    buf = shmbuf.Buffer.attach(name)
    pause_at("writing", flag, go)
    buf.extend(frames(first, n))
    buf.close()

__all__ = ["FRAME", "ROWS", "frames", "consistent", "write_frames_paused"]
