"""Frames written with streamed (non-temporal) stores: the native path's copy of a large
field of its own in a lane larger than any cache (csrc/ring.h: copy_stream, streamed).
The stores bypass the caches and are weakly ordered; the write fences them before it
publishes. These tests run on both paths (the pure-Python path writes the same bytes)."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

import shmbuf
from helpers import FRAME, ROWS, consistent, frames, wait_for_file, write_frames_paused


def make(name):
    return shmbuf.Buffer.create({"frame": ((FRAME,), "uint8"), "i": ((), "int64")}, ROWS, name=name, seed=0)


@pytest.mark.both_storages
def test_streamed_frames_read_back_exactly_at_every_alignment_and_across_the_wrap(name):
    with make(name) as buf:
        buf.extend(frames(0, 9_000))
        buf.extend(frames(9_000, 9_000))       # wraps: 7,400 rows to the end, 1,600 at the start
        for s in range(18_000, 18_003):        # single rows, each at another alignment
            buf.add({k: v[0] for k, v in frames(s, 1).items()})
        ring = buf.engine.ring
        slots = (np.arange(18_003 - ROWS, 18_003)) % ROWS
        want = frames(18_003 - ROWS, ROWS)
        assert (ring.arrays["i"][slots] == want["i"]).all()
        assert (ring.arrays["frame"][slots] == want["frame"]).all()  # every byte: heads, bodies, tails
        got = buf.sample(4_000)
        assert consistent(got) and got["i"].min() >= 18_003 - ROWS


def test_a_row_whose_frame_was_streamed_but_not_published_is_never_sampled(name, tmp_path, break_protection):
    """A writer process stopped after streaming its frames, before the rest of its rows:
    the frames are in memory (fenced or not) and the stamps say "being written", so no
    sample returns those rows; with the stamp check off, they come out torn."""
    flag, go = str(tmp_path / "writing"), str(tmp_path / "go")
    with make(name) as buf:
        buf.extend(frames(0, ROWS))
        child = mp.get_context("spawn").Process(target=write_frames_paused, args=(name, ROWS, 1_000, flag, go))
        child.start()
        try:
            wait_for_file(flag, child, "the writer never reached the copy")
            for _ in range(5):
                assert consistent(buf.sample(4_000, timeout=5))
            break_protection("stamp check")
            assert not all(consistent(buf.sample(4_000, timeout=5)) for _ in range(5))
        finally:
            open(go, "w").close()
            child.join(60)
            if child.is_alive():
                child.kill()
        assert child.exitcode == 0
        assert consistent(buf.sample(4_000))  # published now (the protection still off: all rows whole)
