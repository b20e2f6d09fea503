"""state_dict / load_state_dict of ragged rows: the values come back with their rows
(the same samples after), into a buffer with a history of its own; a record covered
while the state is taken leaves its row out; a state that does not match is refused
and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf
from helpers import STATE_FIELDS as F, state_row as row, state_whole as whole
from shmbuf.core import arena



def test_a_state_comes_back_whole_and_samples_the_same(name):
    with shmbuf.Buffer.create(F, 16, name=name, arena=1 << 13, lanes=2, seed=1) as a, \
            shmbuf.Buffer.create(F, 16, name=name + "-b", arena=1 << 13, lanes=2) as b:
        for k in range(40):
            a.add(row(k), lane=k % 2)
        for k in range(100):  # (b's arena heads are elsewhere: the restore places records anew)
            b.add({"r": np.full(50, 9, np.int32), "lp": np.zeros(50), "p": np.zeros((1, 2), np.int16), "k": -1},
                  lane=k % 2)
        state = a.state_dict()
        assert set(state["ragged"]) == {"r", "lp", "p"}
        b.load_state_dict(state)
        x, y = a.sample(64), b.sample(64)
        assert x["k"].tolist() == y["k"].tolist() and whole(y) and len(b) == len(a) == 16
        for k in range(40, 60):  # and b goes on writing over the restored rows
            b.add(row(k), lane=k % 2)
        z = b.sample(100)
        assert whole(z) and min(z["k"].tolist()) >= 44


def test_a_queue_state_delivers_its_rows_with_their_values(name):
    with shmbuf.Buffer.create(F, 16, name=name, arena=1 << 13, mode="queue") as q, \
            shmbuf.Buffer.create(F, 16, name=name + "-b", arena=1 << 13, mode="queue") as r:
        q.extend({f: [row(k)[f] for k in range(6)] for f in F})
        assert q.take(2)["k"].tolist() == [0, 1]
        r.load_state_dict(q.state_dict())
        t = r.take(10, partial=True, timeout=1)
        assert t["k"].tolist() == [2, 3, 4, 5] and whole(t)


def test_a_record_covered_while_the_state_is_taken_leaves_its_row_out(name, monkeypatch):
    with shmbuf.Buffer.create(F, 16, name=name, arena=1024, seed=0) as buf:
        for k in (8, 9, 10):
            buf.add(row(k))

        def cover(point):
            if point == "reading":
                monkeypatch.setattr(arena, "HOOK", None)
                for k in range(40, 48):  # (wraps the 1,024-byte arena over the three rows' records)
                    buf.add({"r": np.full(20, k, np.int32), "lp": np.zeros(20), "p": np.zeros((0, 2), np.int16), "k": k})
        monkeypatch.setattr(arena, "HOOK", cover)
        state = buf.state_dict()
        assert arena.HOOK is None
        kept = np.flatnonzero(state["stamps"])
        assert not ({8, 9, 10} & set(state["data"]["k"][kept].tolist()))  # (covered: left out)
        assert len(state["ragged"]["r"][1]) == len(kept) + 1


def test_a_state_that_does_not_match_is_refused_and_changes_nothing(name):
    with shmbuf.Buffer.create(F, 16, name=name, arena=1 << 13, seed=1) as a, \
            shmbuf.Buffer.create(F, 16, name=name + "-small", arena=256) as small, \
            shmbuf.Buffer.create(F, 16, name=name + "-b", arena=1 << 13) as b:
        for k in range(10, 16):
            a.add(row(k))
        b.add(row(3))
        state = a.state_dict()
        with pytest.raises(ValueError, match="more than its arena"):
            small.load_state_dict(state)
        bad = {**state, "ragged": {**state["ragged"], "r": (state["ragged"]["r"][0][1:], state["ragged"]["r"][1][:-1])}}
        with pytest.raises(ValueError, match=r"state_dict\['ragged'\]\['r'\] "):
            b.load_state_dict(bad)
        with pytest.raises(ValueError, match="must hold the ragged fields"):
            b.load_state_dict({k: v for k, v in state.items() if k != "ragged"})
        assert len(b) == 1 and b.sample(3)["k"].tolist() == [3, 3, 3] and whole(b.sample(3))
