"""The copies of ragged records (shmbuf/core/arena.py; csrc/records.c): the C copies and
the pure-Python loops give the same bytes on the same segment, both ways; a record word
that does not fit is an error, never an access outside the arena or an output; a batch
given back as ``out=`` is refilled in its own memory (``sample`` and ``take``)."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf
from shmbuf.core import arena, native
from shmbuf.core.segment import FormatError
from shmbuf.ragged import schema

needs_native = pytest.mark.skipif(not native.available(), reason="needs the C extension")
FIELDS = {"prompt": ((None,), np.int32), "response": (("R",), np.int32), "logprobs": (("R",), np.float32),
          "mask": (("R",), np.bool_), "pairs": ((None, 3), np.int16), "k": ((), np.int64)}


def rows(ks, rng) -> dict:
    """Rows of ``k``s, every value from k (lengths from rng, 0 included: odd byte counts)."""
    out = {f: [] for f in FIELDS}
    for k in ks:
        p, r, q = (int(x) for x in rng.integers(0, 23, 3))
        out["prompt"].append(np.arange(p, dtype=np.int32) * 7 + k)
        out["response"].append(np.arange(r, dtype=np.int32) - k)
        out["logprobs"].append(np.arange(r, dtype=np.float32) / 3 - k)
        out["mask"].append((np.arange(r) + k) % 3 == 0)
        out["pairs"].append(np.full((q, 3), k, np.int16) + np.arange(3, dtype=np.int16))
        out["k"].append(k)
    out["k"] = np.array(out["k"])
    return out


def check(batch: dict) -> None:
    for i, k in enumerate(batch["k"].tolist()):
        assert (batch["prompt"][i] == np.arange(len(batch["prompt"][i])) * 7 + k).all()
        r = len(batch["response"][i])
        assert (batch["response"][i] == np.arange(r) - k).all()
        assert (batch["logprobs"][i] == np.arange(r, dtype=np.float32) / 3 - k).all()
        assert (batch["mask"][i] == ((np.arange(r) + k) % 3 == 0)).all()
        assert (batch["pairs"][i] == np.full((len(batch["pairs"][i]), 3), k) + np.arange(3)).all()


def outs_for(a: arena.Arena, words: np.ndarray) -> list:
    """Fresh outputs (values, offsets in elements) for the records of ``words``, values 0xAB."""
    out = []
    for d, e in a.dims:
        offsets = np.concatenate([[0], np.cumsum(words[:, 2 + d])]).astype(np.int64)
        out.append((np.full(int(offsets[-1]) * e, 0xAB, np.uint8), offsets))
    return out


@pytest.fixture
def native_path(monkeypatch):
    """Handles made in the test run the native path (the C copies are the C ring's)."""
    monkeypatch.setenv("SHMBUF_PURE_PYTHON", "")


@needs_native
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_c_and_the_python_copies_give_the_same_bytes(name, native_path, seed):
    """Rows written through several wraps of a small arena: the records of every row
    still there read the same with both readers (and are the rows written); a write
    staged again and copied by each writer into the same records leaves the arena the
    same bytes."""
    rng = np.random.default_rng(seed)
    with shmbuf.Buffer.create(FIELDS, 32, name=name, arena=1 << 14, lanes=2, seed=seed) as buf:
        for start in range(0, 200, 5):  # (records at every alignment, wrapping many times)
            buf.extend(rows(range(start, start + 5), rng))
        a, c = buf.engine.records.arena, buf.engine.ring.native
        words = np.ascontiguousarray(buf.engine.view(schema.FIELD)[:32])
        words = words[words[:, 1] >= a.heads[words[:, 0], 0] - a.A]  # (rows whose record is still there)
        assert len(words) > 10
        got = []
        for read, arenas in ((arena.read_python, a.data), (c.records_read, a._arenas)):
            outs = outs_for(a, words)
            read(words, words.shape[1], arenas, a.A, a.dims, outs)
            got.append([o[0] for o in outs])
        for py, cc in zip(*got):
            assert py.tobytes() == cc.tobytes()
        assert any(len(v) % 8 for v in got[0])  # (fields whose bytes end off an 8-byte boundary)
        # the writers: the same write's values into the same records of the segment
        new = rows(range(500, 505), rng)
        stamped = buf.engine.records.stamp(new, False)
        w = stamped[schema.FIELD]
        w[:, 0], w[:, 1] = 1, a.heads[1, 0] + np.cumsum(a.sizes(w[:, 2:])) - a.sizes(w[:, 2:])
        values = a.staged.values
        after = []
        for write, lane in ((arena.write_python, a.data[1]), (c.records_write, a._lanes[1])):
            a.data[1] = 0x5A
            write(w, w.shape[1], lane, a.A, a.dims, values, 0, None)
            after.append(a.data[1].copy())
        buf.engine.records.done()
        assert (after[0] == after[1]).all() and (after[0] != 0x5A).any()
        outs = outs_for(a, w)
        c.records_read(w, w.shape[1], a._arenas, a.A, a.dims, outs)
        for (vals, offsets), r in zip(outs, buf.engine.records.ragged):
            for i, want in enumerate(new[r.name]):
                e = r.element_bytes
                assert vals[offsets[i] * e:offsets[i + 1] * e].tobytes() == np.asarray(want, r.dtype).tobytes()


@needs_native
def test_the_c_copies_refuse_what_does_not_fit(name, native_path):
    """Words and outputs the C copies are given are checked first: a word whose lane,
    pos or lengths do not fit, outputs too short, values of other sizes are each a
    ValueError, and nothing was copied."""
    with shmbuf.Buffer.create(FIELDS, 16, name=name, arena=4096, lanes=2, seed=0) as buf:
        buf.extend(rows(range(4), np.random.default_rng(0)))
        a, c = buf.engine.records.arena, buf.engine.ring.native
        at = a._arenas  # (the arenas' offset in the segment)
        good = np.ascontiguousarray(buf.engine.view(schema.FIELD)[:4])
        good = good[good[:, 2] >= 0][:2].copy()
        bad_words = []
        for col, value in [(0, 2), (0, -1), (1, -8), (2, -1), (2, a.A), (3, a.A // 4 + 1)]:
            w = good.copy()
            w[1, col] = value
            bad_words.append(w)
        w = good.copy()
        w[1, 1] = a.A - 8  # (a record that would cross the arena's end)
        w[1, 2] = 8
        bad_words.append(w)
        for w in bad_words:
            outs = outs_for(a, np.maximum(w, 0) % (a.A // 8))
            before = [o[0].copy() for o in outs]
            with pytest.raises(ValueError, match="does not fit"):
                c.records_read(w, w.shape[1], at, a.A, a.dims, outs)
            assert all((b == o[0]).all() for b, o in zip(before, outs))  # (nothing copied)
        outs = outs_for(a, good)
        outs[1] = (outs[1][0][:-1], outs[1][1])  # a values buffer a byte short
        with pytest.raises(ValueError, match="does not fit its output"):
            c.records_read(good, good.shape[1], at, a.A, a.dims, outs)
        outs = outs_for(a, good)
        outs[0] = (outs[0][0], outs[0][1][:-1])  # offsets of n rows, not n + 1
        with pytest.raises(ValueError, match="n \\+ 1"):
            c.records_read(good, good.shape[1], at, a.A, a.dims, outs)
        with pytest.raises(ValueError, match="outside the segment"):  # (arenas that end past it)
            c.records_read(good, good.shape[1], at + 8, a.A, a.dims, outs_for(a, good))
        # the writer: values whose bytes differ from the word's, a word outside the arena
        stamped = buf.engine.records.stamp(rows(range(2), np.random.default_rng(1)), False)
        values = a.staged.values
        buf.engine.records.done()
        good = stamped[schema.FIELD]
        good[:, 0], good[:, 1] = 1, np.cumsum(a.sizes(good[:, 2:])) - a.sizes(good[:, 2:])
        snapshot = a.data[1].copy()
        w = good.copy()
        w[0, 2] += 1  # (prompt one longer than its values)
        with pytest.raises(ValueError, match="holds .* bytes, its word says"):
            c.records_write(w, w.shape[1], a._lanes[1], a.A, a.dims, values, 0, None)
        w = good.copy()
        w[1, 1] = a.A - 8
        with pytest.raises(ValueError, match="does not fit the arena"):
            c.records_write(w, w.shape[1], a._lanes[1], a.A, a.dims, values, 0, None)
        with pytest.raises(ValueError, match="every row"):
            c.records_write(good, good.shape[1], a._lanes[1], a.A, a.dims, values, 1, None)
        assert (a.data[1] == snapshot).all()
        c.records_write(good, good.shape[1], a._lanes[1], a.A, a.dims, values, 0, None)
        assert (a.data[1] != snapshot).any()


def test_a_record_word_that_crosses_the_arena_is_damage(name):
    """A record word whose record would cross its arena's end (no writer places one so)
    is refused as damage before anything is copied, on both paths."""
    with shmbuf.Buffer.create(FIELDS, 16, name=name, arena=4096, seed=0) as buf:
        buf.extend(rows(range(4), np.random.default_rng(0)))
        words = buf.engine.ring.arrays[schema.FIELD]  # (writable: the segment's)
        slot = int(np.flatnonzero(words[:, 2] > 0)[0])
        words[slot, 1] = buf.engine.records.arena.A - 8
        del words  # (no view of the segment outlives it in a failure's report)
        with pytest.raises(FormatError, match="record word no shmbuf process writes"):
            for _ in range(50):  # (the damaged row drawn at least once)
                buf.sample(16, timeout=5)


def sized(ks, length: int) -> dict:
    """Rows of ``k``s whose every ragged value has ``length`` values."""
    out = rows(ks, np.random.default_rng(0))
    for f in ("prompt", "response", "logprobs", "mask", "pairs"):
        out[f] = [np.resize(v, (length,) + v.shape[1:]) if len(v) else np.zeros((length,) + v.shape[1:], v.dtype)
                  for v in out[f]]
    out["prompt"] = [np.arange(length, dtype=np.int32) * 7 + k for k in ks]
    out["response"] = [np.arange(length, dtype=np.int32) - k for k in ks]
    out["logprobs"] = [np.arange(length, dtype=np.float32) / 3 - k for k in ks]
    out["mask"] = [(np.arange(length) + k) % 3 == 0 for k in ks]
    out["pairs"] = [np.full((length, 3), k, np.int16) + np.arange(3, dtype=np.int16) for k in ks]
    return out


@pytest.mark.parametrize("how", ["sample", "tokens", "take"])
def test_a_batch_given_back_as_out_is_refilled_in_its_memory(name, how):
    """``out=`` a batch returned earlier: the same dict comes back holding the new rows,
    whole; their ragged values are in the earlier batch's block of memory (one for all
    its ragged fields) while they fit, else in a larger one, kept from then on; a
    sample's fixed arrays are refilled in place too."""
    queue = how == "take"
    with shmbuf.Buffer.create(FIELDS, 64, name=name, arena=1 << 20, mode="queue" if queue else "replay",
                              lanes=1, seed=0) as buf:
        def read(out=None):
            if queue:
                return buf.take(8, out=out)
            if how == "tokens":
                return buf.sample(max_tokens=8 * length, length="R", out=out)
            return buf.sample(8, out=out)

        def base(b):
            blocks = {id(b[f].values.base) for f in ("prompt", "response", "logprobs", "mask", "pairs")}
            assert len(blocks) == 1
            return b["response"].values.base
        length = 5
        buf.extend(sized(range(64), length))  # small rows
        b = read()
        check(b)
        block, k = base(b), b["k"]
        for _ in range(3):
            assert read(b) is b
            check(b)
            assert base(b) is block and len(b["k"]) == 8
            assert (b["k"] is k) == (how == "sample")  # (a take's, a budget's fixed arrays: new)
        length = 40
        if queue:
            buf.take(64, partial=True)  # (the small rows left)
        buf.extend(sized(range(1000, 1064), length))  # larger rows (a replay buffer's small ones evicted)
        assert read(b) is b
        check(b)
        grown = base(b)
        assert grown is not block and grown.nbytes >= 8 * 40 * (4 + 4 + 4 + 1 + 6)
        assert all(k >= 1000 for k in b["k"].tolist())
        assert read(b) is b
        check(b)
        assert base(b) is grown


def test_out_that_is_not_a_batch_is_refused_before_anything(name):
    with shmbuf.Buffer.create(FIELDS, 32, name=name, arena=1 << 16, mode="queue", seed=0) as q:
        q.extend(rows(range(4), np.random.default_rng(0)))
        with pytest.raises(ValueError, match="out must be a dict"):
            q.take(2, out=[1, 2])
        assert len(q) == 4
    with shmbuf.Buffer.create(FIELDS, 32, name=name + "r", arena=1 << 16, seed=0) as buf:
        buf.extend(rows(range(4), np.random.default_rng(0)))
        b = buf.sample(2)
        b["response"] = b["response"].values
        with pytest.raises(ValueError, match="each a shmbuf.Jagged"):
            buf.sample(2, out=b)
