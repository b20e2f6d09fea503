"""Frames written with streamed (non-temporal) stores: the native path's copy of a large
field of its own in a lane larger than any cache (csrc/ring.h: copy_stream, streamed).
The stores bypass the caches and are weakly ordered; the write fences them before it
publishes. These tests run on both paths (the pure-Python path writes the same bytes)."""

from __future__ import annotations

import multiprocessing as mp
import os
import re

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


def test_streamed_stores_are_fenced_after_the_odd_stamps_and_before_the_even_ones(name):
    """Trust round 4, item 1. x86's streamed stores are weakly ordered: without an SFENCE
    between a write's odd stamps and its streamed frames, the frames may land before
    the stamp says "being written", and a reader who checks the old, even stamp before
    and after its copy takes a torn row. The order of each write's steps, as the native
    path takes them (trace_steps: 'o' odd stamps, 'F' SFENCE, 'S' streamed copy, 'c'
    ordinary copy, 'e' even stamps, 'a' abandoned): every write that streams, through
    every entry point (add, extend and its wrap, add_each's put_rows, an abandoned one),
    fences after its odd stamps and before its even ones (or its abandon, whose
    streamed bytes must land before its entry is freed to the next writer of the slots).
    A buffer that streams nothing takes no fence (x86's TSO orders ordinary stores).
    Native path only: the pure-Python path never streams."""
    from shmbuf.core import native, ring

    if native.path() != "native" or not native.extension().STREAMS:
        pytest.skip("the native path streams nothing here (pure-Python path, or no SSE2)")
    ext = native.extension()
    with make(name) as buf:
        ext.trace_steps(True)
        try:
            buf.extend(frames(0, 9_000))
            buf.extend(frames(9_000, 9_000))  # wraps: two copies of each field
            buf.add({k: v[0] for k, v in frames(18_000, 1).items()})
            buf.claim_lane(0)
            buf.add_each(frames(18_001, 2), [0, 0])  # put_rows: a write per row

            def stop(point):
                if point == "writing":
                    raise KeyboardInterrupt

            ring.set_hook(stop)
            with pytest.raises(KeyboardInterrupt):
                buf.add({k: v[0] for k, v in frames(18_003, 1).items()})
        finally:
            ring.set_hook(None)
            got = ext.trace_steps(False)
        assert got.count("S") == 1 + 2 + 1 + 2 + 1, got  # every write streamed its frames
        assert re.fullmatch(r"(oF[Sc]+F[ea])+", got), got
        assert got.endswith("oFSFa") and got.count("e") == 5, got
        assert consistent(buf.sample(4_000))
    with shmbuf.Buffer.create({"frame": ((64,), "uint8"), "i": ((), "int64")}, 100, name=name + "s") as small:
        ext.trace_steps(True)
        small.extend(frames(0, 3) | {"frame": np.zeros((3, 64), np.uint8)})
        small.add({"frame": np.zeros(64, np.uint8), "i": 3})
        assert ext.trace_steps(False) == "occe" * 2
