"""Ragged rows through add/extend/sample/take: values back exactly, on both paths; the
edges (empty rows, a row exactly a lane's arena, wraps at every alignment); bad input
refused with nothing written; what composes and what refuses."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf
from shmbuf.ragged.jagged import Jagged

FIELDS = {"prompt": ((None,), np.int32), "response": (("R",), np.int32),
          "logprobs": (("R",), np.float32), "pairs": ((None, 2), np.int16), "k": ((), np.int64)}


def row(k: int, rng: np.random.Generator, longest: int = 40) -> dict:
    """Row ``k``: every value derived from k, so a reader checks it whole."""
    p, r, q = (int(x) for x in rng.integers(0, longest, 3))
    return {"prompt": np.arange(p, dtype=np.int32) + k, "response": np.full(r, k, np.int32),
            "logprobs": -np.arange(r, dtype=np.float32) - k, "pairs": np.full((q, 2), k % 30000, np.int16), "k": k}


def check(batch: dict) -> None:
    """Every row of a sampled batch is the row its ``k`` names, whole."""
    for i, k in enumerate(batch["k"].tolist()):
        p, r, q = batch["prompt"][i], batch["response"][i], batch["pairs"][i]
        assert (p == np.arange(len(p)) + k).all() and (r == k).all() and (q == k % 30000).all()
        assert q.shape[1:] == (2,) and len(batch["logprobs"][i]) == len(r)
        assert (batch["logprobs"][i] == -np.arange(len(r)) - k).all()


def test_round_trip_add_extend_sample(name):
    rng = np.random.default_rng(0)
    with shmbuf.Buffer.create(FIELDS, 64, name=name, arena=1 << 20, seed=1) as buf:
        rows = [row(k, rng) for k in range(20)]
        for r in rows[:5]:
            buf.add(r)
        buf.extend({f: [r[f] for r in rows[5:12]] for f in FIELDS})  # lists of arrays
        jag = {f: Jagged.concatenate([Jagged(np.asarray(r[f]), [0, len(r[f])]) for r in rows[12:]])
               for f in ("prompt", "response", "logprobs", "pairs")}
        buf.extend({**jag, "k": np.arange(12, 20)})  # Jagged values
        assert len(buf) == 20
        b = buf.sample(200)
        assert isinstance(b["response"], Jagged) and b["k"].shape == (200,)
        assert sorted(set(b["k"].tolist())) == list(range(20))  # (200 draws of 20 rows: each seen)
        check(b)
        assert buf.fields["response"] == (("R",), np.dtype(np.int32)) and buf.fields["pairs"][0] == (None, 2)


def test_empty_rows_and_regular_arrays(name):
    with shmbuf.Buffer.create({"t": ((None,), np.int64), "x": ((), np.int64)}, 8, name=name, arena=4096) as buf:
        buf.add({"t": np.zeros(0, np.int64), "x": 0})
        buf.extend({"t": np.arange(6).reshape(2, 3), "x": [1, 2]})  # (2, 3): two rows of 3
        b = buf.sample(30)
        for i, x in enumerate(b["x"].tolist()):
            assert b["t"][i].tolist() == ([] if x == 0 else [0, 1, 2] if x == 1 else [3, 4, 5])


def test_wraps_at_every_alignment(name):
    """Records of every size 0..40 bytes past every position of a small arena: each row
    sampled is whole, and the rows whose records were covered left the window."""
    with shmbuf.Buffer.create({"t": ((None,), np.uint8), "k": ((), np.int64)}, 32, name=name, arena=256,
                              seed=0) as buf:
        k = 0
        for size in range(41):
            for _ in range(9):  # (enough laps of 256 bytes at each size to meet every offset mod 8)
                buf.add({"t": np.full(size, k % 251, np.uint8), "k": k})
                k += 1
                b = buf.sample(8)
                for i, kk in enumerate(b["k"].tolist()):
                    assert (b["t"][i] == kk % 251).all() and len(b["t"][i]) == size or kk < k - 1
                # every row in the window still has its record: all are readable at once
                lo = int(buf.engine.window()[0][0])
                assert lo >= k - 32
        whole = buf.sample(64)
        assert len(whole["k"]) == 64


def test_a_row_exactly_a_lanes_arena(name):
    with shmbuf.Buffer.create({"t": ((None,), np.uint8), "k": ((), np.int64)}, 8, name=name, arena=128,
                              lanes=2) as buf:
        buf.add({"t": np.full(3, 1, np.uint8), "k": 1}, lane=0)
        buf.add({"t": np.full(64, 2, np.uint8), "k": 2}, lane=0)  # a lane's arena: 64 bytes, exactly
        assert len(buf) == 1  # (the row before it left: its record is covered)
        b = buf.sample(4)
        assert b["k"].tolist() == [2] * 4 and all((b["t"][i] == 2).all() and len(b["t"][i]) == 64 for i in range(4))
        with pytest.raises(ValueError, match="more than a lane's arena"):
            buf.add({"t": np.zeros(65, np.uint8), "k": 3}, lane=1)
        assert int(buf.engine.heads()[1]) == 0


@pytest.mark.parametrize("bad, match", [
    ({"response": np.arange(3), "logprobs": np.zeros(4)}, "length 'R', which must agree"),
    ({"response": np.arange(3.5, 6.5), "logprobs": np.zeros(3)}, "cannot store float64"),
    ({"response": np.arange(3), "logprobs": np.zeros((3, 1))}, r"expected (the value|row 0) of shape \(length,\)"),
    ({"response": np.arange(3)}, "missing"),
    ({"response": np.arange(10**6), "logprobs": np.zeros(10**6)}, "more than a lane's arena"),
    ({"response": np.array([300, 2**40]), "logprobs": np.zeros(2)}, "do not fit in int32"),
])
def test_bad_rows_change_nothing(name, bad, match):
    fields = {"response": (("R",), np.int32), "logprobs": (("R",), np.float32), "x": ((), np.int64)}
    with shmbuf.Buffer.create(fields, 8, name=name, arena=4096, seed=3) as buf:
        buf.add({"response": np.arange(2), "logprobs": np.zeros(2), "x": 0})
        state = buf.engine.rng.bit_generator.state
        heads, reserved = buf.engine.heads().copy(), buf.engine.ring.records.heads.copy()
        with pytest.raises((ValueError, TypeError), match=match):
            buf.add({**bad, "x": 1})
        with pytest.raises((ValueError, TypeError), match=match):
            buf.extend({k: [v] if k != "x" else [1] for k, v in {**bad, "x": 1}.items()})
        assert (buf.engine.heads() == heads).all() and (buf.engine.ring.records.heads == reserved).all()
        assert buf.engine.rng.bit_generator.state == state
        b = buf.sample(3)
        assert b["x"].tolist() == [0, 0, 0] and b["response"][0].tolist() == [0, 1]


def test_create_refusals(name):
    with pytest.raises(ValueError, match="need arena="):
        shmbuf.Buffer.create({"t": ((None,), np.int32)}, 8, name=name)
    with pytest.raises(ValueError, match="arena= is for a buffer with ragged fields"):
        shmbuf.Buffer.create({"t": ((3,), np.int32)}, 8, name=name, arena=1024)
    with pytest.raises(ValueError, match="only the first dimension may vary"):
        shmbuf.Buffer.create({"t": ((None, None), np.int32)}, 8, name=name, arena=1024)
    with pytest.raises(ValueError, match="max_times_sampled"):
        shmbuf.Buffer.create({"t": ((None,), np.int32)}, 8, name=name, arena=1024, max_times_sampled=2)
    with pytest.raises(ValueError, match="arena= must be an int"):
        shmbuf.Buffer.create({"t": ((None,), np.int32)}, 8, name=name, arena=1.5)
    with shmbuf.Buffer.create({"t": ((None,), np.int32), "x": ((), np.int64)}, 8, name=name, arena=1024) as buf:
        buf.add({"t": np.arange(2), "x": 1})
        for call in (lambda: buf.sample_sequences(2, 2), lambda: buf.empty_batch(2)):
            with pytest.raises(ValueError, match="not supported yet"):
                call()


def test_attach_by_name_reads_the_same(name):
    rng = np.random.default_rng(5)
    with shmbuf.Buffer.create(FIELDS, 32, name=name, arena=1 << 16, lanes=2) as buf:
        buf.extend({f: [r[f] for r in rs] for f in FIELDS} if (rs := [row(k, rng) for k in range(10)]) else {},
                   lane=1)
        other = shmbuf.Buffer.attach(name)
        try:
            assert other.fields == buf.fields and other.parts.specs == buf.parts.specs
            check(other.sample(50))
            other.add(row(99, rng), lane=0)
            check(buf.sample(50))
        finally:
            other.close()


def test_token_budget_sample(name):
    with shmbuf.Buffer.create({"r": (("R",), np.int32), "k": ((), np.int64)}, 64, name=name, arena=1 << 16,
                              seed=0) as buf:
        buf.extend({"r": [np.full(k + 1, k, np.int32) for k in range(40)], "k": np.arange(40)})
        for budget in (1, 7, 50, 300, 10_000):
            b = buf.sample(max_tokens=budget, length="R")
            lengths = b["r"].lengths
            assert len(lengths) >= 1 and (lengths.sum() <= budget or len(lengths) == 1)
            assert (b["r"].values == np.repeat(b["k"], lengths)).all()
        assert len(buf.sample(3, max_tokens=10_000, length="r")["k"]) == 3  # (n caps it; a field names its length)
        with pytest.raises(ValueError, match="names no ragged field"):
            buf.sample(max_tokens=5, length="nope")
        with pytest.raises(ValueError, match="both max_tokens= and length="):
            buf.sample(max_tokens=5)


def test_queue_take_exactly_once_and_budget(name):
    """A queue's room is counted in bytes too: a write waits until takes free the records
    its bytes would cover; a budget stops a take at the row that would pass it."""
    fields = {"r": (("R",), np.int32), "lp": (("R",), np.float32), "k": ((), np.int64)}
    big = {"r": np.full(400, 2, np.int32), "lp": np.full(400, 2.0), "k": 2}  # 3,200 bytes
    with shmbuf.Buffer.create(fields, 16, name=name, arena=4096, mode="queue") as q:
        q.extend({"r": [np.full(100, 0, np.int32), np.full(100, 1, np.int32)],
                  "lp": [np.zeros(100), np.ones(100)], "k": [0, 1]})  # 800 bytes each
        with pytest.raises(TimeoutError, match="arena of 4,096 bytes has no room"):
            q.add(big, timeout=0.05)
        t = q.take(5, partial=True, max_tokens=150, length="R")  # the second row would pass 150
        assert t["k"].tolist() == [0] and t["r"][0].tolist() == [0] * 100
        with pytest.raises(TimeoutError, match="no room"):
            q.add(big, timeout=0.05)  # (placed at the arena's start, it would cover row 1's record)
        t = q.take(5, max_tokens=150, length="R", timeout=1, partial=True)
        assert t["k"].tolist() == [1] and (t["lp"][0] == 1.0).all()
        q.add(big, timeout=1)  # room now
        t = q.take(5, max_tokens=10_000, length="R", timeout=0.05, partial=True)
        assert t["k"].tolist() == [2] and (t["lp"][0] == 2.0).all() and len(t["r"][0]) == 400
        assert len(q) == 0
        q.add({"r": np.full(3, 7, np.int32), "lp": np.zeros(3), "k": 3})
        t = q.take(4, max_tokens=2, length="R", timeout=1)  # at least one row, whatever its length
        assert t["k"].tolist() == [3]


def test_versions_and_rate_compose(name):
    fields = {"r": ((None,), np.int32), "k": ((), np.int64)}
    with shmbuf.Buffer.create(fields, 32, name=name, arena=1 << 14, versions=True, seed=0,
                              rate=shmbuf.RateLimit(samples_per_insert=4, min_size=1, error_buffer=1000)) as buf:
        for v in range(5):
            buf.add({"r": np.full(v + 1, v, np.int32), "k": v}, version=v)
        b = buf.sample(20, max_staleness=1)
        assert set(b["k"].tolist()) <= {3, 4} and all((b["r"][i] == b["k"][i]).all() for i in range(20))
        assert set(b["version"].tolist()) <= {3, 4}
    with shmbuf.Buffer.create(fields, 32, name=name + "-q", arena=1 << 14, versions=True, mode="queue") as q:
        for v in range(5):
            q.add({"r": np.full(v + 1, v, np.int32), "k": v}, version=v)
        t = q.take(10, partial=True, max_staleness=1)
        assert t["k"].tolist() == [3, 4] and t["r"][1].tolist() == [4] * 5


def test_priorities_compose(name):
    with shmbuf.Buffer.create({"r": ((None,), np.int32), "k": ((), np.int64)}, 16, name=name, arena=4096,
                              priority=1.0, seed=0) as buf:
        buf.extend({"r": [np.full(k, k, np.int32) for k in range(4)], "k": np.arange(4)}, priority=[1e-9, 1e-9, 1e-9, 1.0])
        b = buf.sample(50)
        assert (b["k"] == 3).mean() > 0.95 and b["r"][0].tolist() == [b["k"][0]] * int(b["k"][0])
        assert b["index"].shape == (50, 2) and b["weight"].shape == (50,)


def test_take_keeps_each_write_whole_with_groups(name):
    """A GRPO group written by one extend comes out of a take whole: a take ends before a
    group that would pass n or the budget, and takes a first group larger than n whole."""
    fields = {"r": (("R",), np.int32), "g": ((), np.int64)}
    with shmbuf.Buffer.create(fields, 64, name=name, arena=1 << 16, mode="queue") as q:
        for g, size in enumerate([3, 4, 2, 6]):
            q.extend({"r": [np.full(10, g, np.int32)] * size, "g": [g] * size})
        assert q.take(5, groups=True)["g"].tolist() == [0, 0, 0]  # (group 1 would pass 5 rows)
        assert q.take(5, groups=True, max_tokens=70, length="R")["g"].tolist() == [1, 1, 1, 1, 2, 2][:4]
        t = q.take(1, groups=True)  # (a group larger than n: whole)
        assert t["g"].tolist() == [2, 2]
        t = q.take(100, groups=True, partial=True)
        assert t["g"].tolist() == [3] * 6 and all((t["r"][i] == 3).all() for i in range(6))
        with pytest.raises(ValueError, match="groups= are for a buffer with ragged fields"):
            with shmbuf.Buffer.create({"x": ((), np.int64)}, 8, name=name + "-plain", mode="queue") as p:
                p.take(1, groups=True)


def test_stats_and_refusals(name):
    with shmbuf.Buffer.create({"r": ((None,), np.int32), "x": ((), np.int64)}, 8, name=name, arena=1024,
                              lanes=2) as buf:
        buf.add({"r": np.arange(10), "x": 1}, lane=1)
        lanes = buf.stats()["lanes"]
        assert [d["arena_bytes"] for d in lanes] == [512, 512]
        assert lanes[1]["arena_reserved"] == 40 and lanes[1]["arena_held"] == 40 and lanes[0]["arena_held"] == 0
        with pytest.raises(ValueError, match="add_each.*not supported yet"):
            buf.add_each({"r": [np.arange(2), np.arange(3)], "x": [1, 2]}, lanes=[0, 1])
        assert len(buf) == 1
        assert shmbuf.Jagged is Jagged


def test_shmbuf_stat_shows_each_lanes_arena(name):
    from helpers.processes import cli
    with shmbuf.Buffer.create({"r": ((None,), np.int32), "x": ((), np.int64)}, 8, name=name, arena=1 << 22) as buf:
        buf.add({"r": np.arange(100_000), "x": 1})  # 400,000 bytes
        res = cli("stat", name)
        assert res.returncode == 0, res.stderr
        assert "ARENA USED" in res.stdout and "0.4 of 4.0 MiB" in res.stdout


def test_what_cannot_hold_ragged_fields_says_so(name):
    fields = {"r": ((None,), np.int32), "x": ((), np.int64)}
    with pytest.raises(ValueError, match="an EpisodeBuffer has no ragged fields"):
        shmbuf.EpisodeBuffer.create(fields, 8, arena=1024)
    with shmbuf.Buffer.create(fields, 8, name=name, arena=1024) as buf:
        buf.add({"r": np.arange(3), "x": 1})
        for call in (lambda: buf.sample_sequences(1, 1), lambda: buf.empty_batch(2)):
            with pytest.raises(ValueError, match="not supported yet"):
                call()


@pytest.mark.extras
def test_torch_refuses_ragged_in_its_sampler_and_takes_jagged_batches(name):
    torch = pytest.importorskip("torch")
    from shmbuf.torch import TorchSampler
    with shmbuf.Buffer.create({"r": ((None,), np.int32), "x": ((), np.int64)}, 8, name=name, arena=1024) as buf:
        buf.extend({"r": [np.arange(3), np.arange(5)], "x": [1, 2]})
        with pytest.raises(ValueError, match=r"TorchSampler takes fixed fields only, and \['r'\] are ragged"):
            TorchSampler(buf, 2)
        b = buf.sample(4)
        nt = b["r"].to_torch()
        assert nt.is_nested and torch.equal(nt.values(), torch.from_numpy(b["r"].values))
        assert [len(t) for t in nt.unbind()] == b["r"].lengths.tolist()


def test_a_truncated_extend_keeps_its_last_rows_whole(name):
    with shmbuf.Buffer.create({"r": ((None,), np.int32), "k": ((), np.int64)}, 4, name=name, arena=4096,
                              seed=0) as buf:
        buf.extend({"r": [np.full(k, k, np.int32) for k in range(10)], "k": np.arange(10)}, truncate_ok=True)
        b = buf.sample(40)
        assert set(b["k"].tolist()) == {6, 7, 8, 9}
        assert all((b["r"][i] == k).all() and len(b["r"][i]) == k for i, k in enumerate(b["k"].tolist()))


def test_sample_whole_groups_uniformly(name):
    """sample(n, groups=True): n groups, each the rows of one extend, in order and whole;
    every group as likely as another whatever its size; a group whose first rows left
    the ring is never returned."""
    fields = {"r": ((None,), np.int32), "g": ((), np.int64), "i": ((), np.int64)}
    with shmbuf.Buffer.create(fields, 16, name=name, arena=1 << 14, seed=0) as buf:
        sizes = [5, 1, 3, 4, 2, 6]  # 21 rows into 16: group 0 loses its first rows
        for g, size in enumerate(sizes):
            buf.extend({"r": [np.full(i + g, g, np.int32) for i in range(size)], "g": [g] * size, "i": np.arange(size)})
        b = buf.sample(3000, groups=True)
        starts = np.flatnonzero(b["i"] == 0)
        assert len(starts) == 3000 and starts[0] == 0
        ends = np.r_[starts[1:], len(b["i"])]
        counts = np.zeros(len(sizes), int)
        for s, e in zip(starts.tolist(), ends.tolist()):
            g = int(b["g"][s])
            assert b["i"][s:e].tolist() == list(range(sizes[g])) and (b["g"][s:e] == g).all()
            assert all(len(b["r"][j]) == b["i"][j] + g and (b["r"][j] == g).all() for j in range(s, e))
            counts[g] += 1
        assert counts[0] == 0 and counts[1:].min() > 500  # (5 groups, 600 each expected)
        with pytest.raises(ValueError, match="groups=True takes n"):
            buf.sample(3, groups=True, beta=0.4)
    with shmbuf.Buffer.create({"x": ((), np.int64)}, 4, name=name + "-plain") as plain:
        plain.add({"x": 1})
        with pytest.raises(ValueError, match="groups= is for a buffer with ragged fields"):
            plain.sample(1, groups=True)


def test_a_group_sample_that_finds_no_whole_group_says_what_it_found(name):
    """A buffer whose only group lost its first rows holds no whole group: the timeout
    says what the last round found (counts, not a guess at the cause)."""
    fields = {"r": ((None,), np.int32), "i": ((), np.int64)}
    with shmbuf.Buffer.create(fields, 16, name=name, arena=1 << 14, seed=0) as buf:
        buf.extend({"r": [np.arange(2)] * 20, "i": np.arange(20)}, truncate_ok=True)  # rows 4..19 kept
        with pytest.raises(shmbuf.SampleTimeout, match=r"the last round drew \d+ rows, 0 of them a group's first row, "
                                                       r"and 0 of those groups were read whole"):
            buf.sample(1, groups=True, timeout=0.2)


def test_whole_groups_keep_every_field_of_the_users(name):
    """A user's field whose name starts with an underscore comes with a group sample as
    with any other (only the buffer's own hidden fields stay behind)."""
    fields = {"r": ((None,), np.int32), "_id": ((), np.int64)}
    with shmbuf.Buffer.create(fields, 8, name=name, arena=4096, seed=0) as buf:
        buf.extend({"r": [np.arange(2), np.arange(3)], "_id": [7, 7]})
        b = buf.sample(2, groups=True)
        assert sorted(b) == ["_id", "r"] and b["_id"].tolist() == [7, 7, 7, 7]
