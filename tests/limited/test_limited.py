"""Rows sampled at most k times (``Buffer.create(max_times_sampled=k)``), across
processes, under storms, SIGKILL and Ctrl-C at chosen points of a count (both paths:
scripts/test runs this file on each)."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time

import numpy as np
import pytest

import shmbuf
from shmbuf.core import segment
from shmbuf.limited import sampler as limited

from helpers import (count_and_stop, counted_buffer, counting_sampler, returned_keys, stop_and_join, storm_torn,
                     wait_for_file, write_keys)

X = {"x": ((), "int64")}


def counted(name, capacity=16, k=2, **kw):
    return shmbuf.Buffer.create(X, capacity, name=name, max_times_sampled=k, seed=0, **kw)


@pytest.fixture
def hook():
    yield lambda f: setattr(limited, "HOOK", f)
    limited.HOOK = None


@pytest.mark.both_storages
def test_each_row_comes_out_at_most_k_times_then_never(name):
    with counted(name, 64, k=3, lanes=2) as buf:
        buf.extend({"x": np.arange(20)}, lane=0)
        buf.extend({"x": np.arange(100, 110)}, lane=1)
        seen: dict[int, list[int]] = {}
        for _ in range(30):  # 90 rows may come out, 7 at a time: the 13th sample finds 6
            try:
                b = buf.sample(7, timeout=0.05)
            except shmbuf.SampleTimeout as e:
                assert str(e).endswith("every row the buffer holds (30) was sampled max_times_sampled=3 times, "
                                       "counting the 6 this sample took (given back now)")
                break
            for x, t in zip(b["x"].tolist(), b["times_sampled"].tolist()):
                seen.setdefault(x, []).append(t)
        assert sum(map(len, seen.values())) == 84 and len(seen) == 30
        assert all(sorted(t) == list(range(1, len(t) + 1)) and len(t) <= 3 for t in seen.values())
        left = buf.sample(6)  # the failed sample gave its rows back: 6 samples are left
        for x, t in zip(left["x"].tolist(), left["times_sampled"].tolist()):
            seen[x].append(t)
        assert all(sorted(t) == [1, 2, 3] for t in seen.values())  # every row: exactly k, counted in order
        with pytest.raises(shmbuf.SampleTimeout, match=r"every row the buffer holds \(30\) was sampled "
                                                       r"max_times_sampled=3 times"):
            buf.sample(1, timeout=0.05)
        buf.add({"x": 999})  # a new row: sampled again
        assert buf.sample(1)["x"].tolist() == [999]
        stats = buf.stats()
        assert stats["rows_sampled"] == 84 + 6 + 1
        assert (stats["max_times_sampled"], stats["rows_used_up"]) == (3, 30)


def test_a_timeout_spent_before_the_first_round_still_says_every_row_is_used_up(name):
    """timeout=0 (a deadline that passes before the sample starts, as on a loaded machine):
    the error still says what the sampler found (the read runs two rounds at least)."""
    with counted(name, k=1) as buf:
        buf.extend({"x": np.arange(4)})
        buf.sample(4)
        with pytest.raises(shmbuf.SampleTimeout, match=r"every row the buffer holds \(4\) was sampled "
                                                       r"max_times_sampled=1 times"):
            buf.sample(1, timeout=0)


def test_the_same_row_twice_in_a_batch_counts_twice(name):
    with counted(name, k=2) as buf:
        buf.add({"x": 5})
        assert buf.sample(2)["times_sampled"].tolist() == [1, 2]
        with pytest.raises(shmbuf.SampleTimeout):
            buf.sample(1, timeout=0.05)
    with counted(name + "b", k=1) as buf:
        buf.extend({"x": np.arange(8)})
        assert sorted(buf.sample(8)["x"].tolist()) == list(range(8))  # each once: all of them


def test_overwritten_rows_start_again_and_are_never_returned_uncounted(name, hook):
    """A writer overwrites every counted row between the count and the copy (the hook,
    at "released"): the sample draws again and returns new rows, each counted."""
    with counted(name, 4, k=1) as buf:
        buf.extend({"x": np.arange(4)})

        def overwrite(where):
            if where == "released":
                hook(None)
                buf.extend({"x": np.arange(10, 14)})

        hook(overwrite)
        b = buf.sample(2)
        assert set(b["x"].tolist()) <= {10, 11, 12, 13} and b["times_sampled"].tolist() == [1, 1]
        rest = buf.sample(2)
        assert sorted(b["x"].tolist() + rest["x"].tolist()) == [10, 11, 12, 13]
        with pytest.raises(shmbuf.SampleTimeout):
            buf.sample(1, timeout=0.05)


@pytest.mark.parametrize("end", ["interrupt", "timeout"])
def test_a_give_back_never_lands_on_the_row_that_took_the_slot(name, hook, end):
    """A sample that ends without returning (a Ctrl-C after its count, or its timeout)
    gives its counts back; a writer overwrites every slot just as it does (the hook, at
    "giving back": the lock held, the counted rows found still in their slots). The
    new rows are each returned once (k=1), never twice: no count goes below 0."""
    with counted(name, 4, k=1) as buf:
        buf.claim_lane()  # (its writes take no lock: they go on while the give-back holds it)
        buf.extend({"x": np.arange(4)})

        def overwrite(where):
            if where == "released" and end == "interrupt":
                raise KeyboardInterrupt
            if where == "giving back":
                hook(None)
                buf.extend({"x": np.arange(10, 14)})

        hook(overwrite)
        with pytest.raises(KeyboardInterrupt if end == "interrupt" else shmbuf.SampleTimeout):
            buf.sample(2 if end == "interrupt" else 5, timeout=0.2)
        hook(None)
        assert buf.engine.view("times_sampled")[:4].min() >= 0
        b = buf.sample(4)
        assert sorted(b["x"].tolist()) == [10, 11, 12, 13] and b["times_sampled"].tolist() == [1, 1, 1, 1]
        with pytest.raises(shmbuf.SampleTimeout, match=r"every row the buffer holds \(4\) was sampled"):
            buf.sample(1, timeout=0.05)


def test_counts_travel_with_saves_and_state_dicts(name, tmp_path):
    with counted(name, 8, k=1) as buf:
        buf.extend({"x": np.arange(4)})
        first = set(buf.sample(3)["x"].tolist())
        state = buf.state_dict()
        buf.save(tmp_path / "save")
        with shmbuf.Buffer.load(tmp_path / "save", name=name + "-back") as back:
            assert back.max_times_sampled == 1
            assert back.sample(1)["x"].tolist() == list({0, 1, 2, 3} - first)
            with pytest.raises(shmbuf.SampleTimeout):
                back.sample(1, timeout=0.05)
        with shmbuf.Buffer.attach(name) as other:
            other.load_state_dict(state)
            assert other.sample(1)["x"].tolist() == list({0, 1, 2, 3} - first)


def test_a_state_or_save_with_negative_counts_is_refused_and_changes_nothing(name, tmp_path):
    """A hostile state dict (or save) whose counts are below 0 would let a row out more
    than k times: refused with a ValueError that says so, the buffer as it was."""
    with counted(name, 8, k=1) as buf:
        buf.extend({"x": np.arange(4)})
        state = buf.state_dict()
        bad = {**state, "data": {**state["data"], "times_sampled": state["data"]["times_sampled"].copy()}}
        bad["data"]["times_sampled"][2] = -3
        with shmbuf.Buffer.attach(name) as other:
            other.sample(1)
            before = (other.engine.view("times_sampled").copy(), other.engine.rng.bit_generator.state)
            with pytest.raises(ValueError, match=r"state_dict\['data'\]\['times_sampled'\] holds counts below 0 "
                                                 r"\(1 row\(s\), the least -3\)"):
                other.load_state_dict(bad)
            assert (other.engine.view("times_sampled") == before[0]).all()
            assert other.engine.rng.bit_generator.state == before[1]
            assert len(other) == 4 and len(other.sample(3)["x"]) == 3
        buf.save(tmp_path / "save")
        np.save(tmp_path / "save" / "field-001.npy", bad["data"]["times_sampled"])  # (fields in order: x, times_sampled)
        with pytest.raises(ValueError, match="holds counts below 0"):
            shmbuf.Buffer.load(tmp_path / "save", name=name + "-back")
        assert not [n for n in segment.list_names() if n.startswith(name + "-back")]


def test_other_reads_and_bad_input_are_clear_errors_that_change_nothing(name):
    with counted(name, k=2) as buf:
        buf.extend({"x": np.arange(4)})
        with pytest.raises(ValueError, match=r"only sample\(\) reads it"):
            buf.sample_sequences(2, 2)
        with pytest.raises(ValueError, match="beta= is for a prioritized buffer"):
            buf.sample(1, beta=0.4)
        with pytest.raises(ValueError, match="'times_sampled' is kept by shmbuf"):
            buf.add({"x": 1, "times_sampled": 0})
        assert len(buf) == 4 and buf.stats()["rows_sampled"] == 0
        assert buf.engine.view("times_sampled")[:4].tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="cannot sample from an empty buffer"):
        with counted(name + "e") as buf:
            buf.sample(1)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"max_times_sampled must be an int >= 1 \(or None: no limit\), got"):
            counted(name + "x", k=bad)
    for kw in ({"mode": "queue"}, {"priority": 0.6}, {"sampler": "newest"}):
        with pytest.raises(ValueError, match=r"and max_times_sampled=2 do not go together|max_times_sampled=2 and .* do not go together"):
            counted(name + "x", **kw)
    with pytest.raises(ValueError, match="without 'times_sampled'"):
        shmbuf.Buffer.create({"times_sampled": ((), "int64")}, 4, name=name + "x", max_times_sampled=1)
    assert "limited" not in shmbuf.samplers.names()


def _stopped_sampler(name, point, tmp_path, n):
    ctx = mp.get_context("spawn")
    flag = str(tmp_path / f"{point}.flag")
    proc = ctx.Process(target=count_and_stop, args=(name, point, flag, n))
    proc.start()
    wait_for_file(flag, proc, f"the sampler never reached {point!r}")
    return proc, flag


@pytest.mark.parametrize("point", ["counted", "released"])
def test_a_sampler_killed_mid_count_costs_its_rows_one_sample_and_blocks_no_one(name, point, tmp_path):
    """A sampler SIGKILLed holding the lock with its counts written ("counted"), or just
    after ("released"): the row it counted stays counted (k=1: it never comes out), the
    lock it held is taken over, and new rows are sampled at once."""
    with counted(name, 8, k=1) as buf:
        buf.add({"x": 0})
        proc, _ = _stopped_sampler(name, point, tmp_path, 1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        with pytest.raises(shmbuf.SampleTimeout, match=r"every row the buffer holds \(1\) was sampled"):
            buf.sample(1, timeout=0.5)
        buf.extend({"x": np.arange(10, 12)})
        assert sorted(buf.sample(2, timeout=5)["x"].tolist()) == [10, 11]


def test_a_ctrl_c_after_the_count_gives_the_rows_back(name, tmp_path):
    """A real SIGINT to a sampler stopped after its count: the sample raises
    KeyboardInterrupt and the rows it counted are counted back down (all 4 come out)."""
    with counted(name, 8, k=1) as buf:
        buf.extend({"x": np.arange(4)})
        proc, flag = _stopped_sampler(name, "released", tmp_path, 4)
        os.kill(proc.pid, signal.SIGINT)
        wait_for_file(flag + ".interrupted", proc, "the sampler did not end with KeyboardInterrupt")
        proc.join(30)
        assert sorted(buf.sample(4, timeout=5)["x"].tolist()) == [0, 1, 2, 3]


def test_storm_samplers_killed_at_random_never_get_a_row_more_than_k_times(name, tmp_path):
    """Two writers write 600 distinct rows while three processes sample 8 at a time;
    a sampler is SIGKILLed and replaced every few milliseconds, 30 times. Counted
    across every sample every process returned (logged once each returned), no row
    came out more than k=2 times, and none torn. With the count's check switched off
    (``now < k``), this test fails (tried by hand)."""
    ctx = mp.get_context("spawn")
    stop = str(tmp_path / "stop")
    logs = []

    def sampler():
        logs.append(str(tmp_path / f"log{len(logs)}"))
        p = ctx.Process(target=counting_sampler, args=(name, logs[-1], stop, 8))
        p.start()
        return p

    with counted_buffer(name, 1024, 2) as buf:
        writers = [ctx.Process(target=write_keys, args=(name, w, 300, 7)) for w in range(2)]
        for p in writers:
            p.start()
        samplers = [sampler() for _ in range(3)]
        rng = random.Random(0)
        try:
            for _ in range(30):
                time.sleep(rng.uniform(0.005, 0.05))
                victim = samplers.pop(rng.randrange(len(samplers)))
                os.kill(victim.pid, signal.SIGKILL)
                victim.join(30)
                samplers.append(sampler())
            for p in writers:
                p.join(120)
                assert p.exitcode == 0
            deadline = time.monotonic() + 120
            while sum(returned_keys(logs)[0].values()) < 100 and time.monotonic() < deadline:
                time.sleep(0.05)  # (the live samplers go on: some rows have come out)
        finally:
            stop_and_join(samplers, stop)
        for p in samplers:
            assert p.exitcode == 0
        counts, torn = returned_keys(logs)
        for _ in range(2 * 600 + 1):  # and what is left comes out here, each row up to its k
            try:
                b = buf.sample(1, timeout=0.05)
            except shmbuf.SampleTimeout:
                break
            torn += storm_torn(b)
            key = int(b["a"][0, 0])
            counts[key] = counts.get(key, 0) + 1
    assert torn == 0
    assert sum(counts.values()) >= 100 and max(counts.values()) <= 2, max(counts.values())
    assert set(counts) <= {w * 1_000_000_000 + i for w in range(2) for i in range(300)}
