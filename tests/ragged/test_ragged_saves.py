"""save() / Buffer.load() of ragged rows: the values come back with their rows (format
4: per ragged field a values and an offsets .npy); a record covered while the save
runs leaves its row out, never torn; a damaged save, or one whose arena cannot hold its
rows, is refused before anything is created."""

from __future__ import annotations

import json
import multiprocessing as mp
import time

import numpy as np
import pytest

import shmbuf
from helpers import RAGGED_FIELDS, STATE_FIELDS as F, ragged_torn, ragged_writer, read_log, state_row as row, \
    state_whole as whole
from shmbuf import Jagged
from shmbuf.core import arena, segment
from shmbuf.persist import save as persist

CTX = mp.get_context("fork")



def test_a_save_loads_back_whole_with_the_same_arena_and_samples(name, tmp_path):
    with shmbuf.Buffer.create(F, 16, name=name, arena=1 << 13, lanes=2, seed=1) as a:
        for k in range(40):
            a.add(row(k), lane=k % 2)
        summary = a.save(tmp_path / "s")
        assert summary["rows"] == 16 and summary["rows_left_out"] == 0
        meta = json.loads((tmp_path / "s" / "shmbuf.json").read_text())
        assert meta["format_version"] == persist.RAGGED_FORMAT_VERSION
        assert [r["name"] for r in meta["ragged"]] == ["r", "lp", "p"]
        offsets = np.load(tmp_path / "s" / meta["ragged"][2]["offsets"], allow_pickle=False)
        values = np.load(tmp_path / "s" / meta["ragged"][2]["values"], allow_pickle=False)
        assert offsets.dtype == np.int64 and offsets[0] == 0 and offsets[-1] == len(values) and values.shape[1:] == (2,)
        with shmbuf.Buffer.load(tmp_path / "s", name=name + "-l", restore_rng=True) as b:
            assert b.fields == a.fields and len(b) == 16
            assert [d["arena_bytes"] for d in b.stats()["lanes"]] == [d["arena_bytes"] for d in a.stats()["lanes"]]
            x, y = a.sample(64), b.sample(64)
            assert x["k"].tolist() == y["k"].tolist() and whole(y)
            for k in range(40, 70):  # (and it goes on writing over the loaded rows)
                b.add(row(k), lane=k % 2)
            z = b.sample(100)
            assert whole(z) and min(z["k"].tolist()) >= 54
            b.unlink()
        assert a.save(tmp_path / "s", overwrite=True)["rows"] == 16  # (its files are a save's: replaced)


def test_a_saved_queue_delivers_its_rows_not_taken_with_their_values(name, tmp_path):
    with shmbuf.Buffer.create(F, 16, name=name, arena=1 << 13, mode="queue") as q:
        q.extend({f: [row(k)[f] for k in range(6)] for f in F})
        assert q.take(2)["k"].tolist() == [0, 1]
        q.save(tmp_path / "q")
        with shmbuf.Buffer.load(tmp_path / "q", name=name + "-l") as r:
            t = r.take(10, partial=True, timeout=1)
            assert t["k"].tolist() == [2, 3, 4, 5] and whole(t)
            r.unlink()


def cover_while_reading(buf, monkeypatch):
    """arena.HOOK: at the save's read of the records (the fixed rows copied), a writer
    covers the records of the rows there (keys 8, 9, 10) by wrapping the 1,024-byte arena."""
    def cover(point):
        if point == "reading":
            monkeypatch.setattr(arena, "HOOK", None)
            for k in range(40, 48):
                buf.add({"r": np.full(20, k, np.int32), "lp": np.zeros(20), "p": np.zeros((0, 2), np.int16), "k": k})
    monkeypatch.setattr(arena, "HOOK", cover)


def test_a_record_covered_while_the_save_runs_leaves_its_row_out(name, tmp_path, monkeypatch):
    with shmbuf.Buffer.create(F, 16, name=name, arena=1024, seed=0) as buf:
        for k in (8, 9, 10):
            buf.add(row(k))
        cover_while_reading(buf, monkeypatch)
        summary = buf.save(tmp_path / "s")
        assert arena.HOOK is None  # (the hook ran: the records were covered mid-save)
        assert summary["rows"] == 0 and summary["rows_left_out"] == 3
        stamps = np.load(tmp_path / "s" / "stamps.npy", allow_pickle=False)
        assert not stamps.any()
        with shmbuf.Buffer.load(tmp_path / "s", name=name + "-l") as b:
            assert len(b) == 0
            b.add(row(11))
            assert b.sample(4)["k"].tolist() == [11] * 4 and whole(b.sample(4))
            b.unlink()


def test_a_row_whose_record_survives_is_kept_beside_one_left_out(name, tmp_path, monkeypatch):
    with shmbuf.Buffer.create(F, 16, name=name, arena=1024, lanes=2, seed=0) as buf:
        buf.add(row(8), lane=0)
        buf.add(row(12), lane=1)  # (lane 1's arena: not covered)

        def cover(point):
            if point == "reading":
                monkeypatch.setattr(arena, "HOOK", None)
                for k in range(40, 44):  # (lane 0's 512 bytes wrap over row 8's record)
                    buf.add({"r": np.full(20, k, np.int32), "lp": np.zeros(20), "p": np.zeros((0, 2), np.int16),
                             "k": k}, lane=0)
        monkeypatch.setattr(arena, "HOOK", cover)
        summary = buf.save(tmp_path / "s")
        assert summary["rows"] == 1 and summary["rows_left_out"] == 1
        with shmbuf.Buffer.load(tmp_path / "s", name=name + "-l") as b:
            got = b.sample(8)
            assert got["k"].tolist() == [12] * 8 and whole(got)
            b.unlink()


def damaged(tmp_path, name):
    """A fresh save of ragged rows at tmp_path/name, and its metadata."""
    d = tmp_path / name
    return d, json.loads((d / "shmbuf.json").read_text())


def npy(d, file, a):
    (d / file).unlink()
    np.save(d / file, a, allow_pickle=False)


@pytest.mark.parametrize("damage, message", [
    ("offsets down", "offsets must not decrease"),
    ("values short", "offsets must end at len"),
    ("lengths disagree", "whose lengths"),
    ("wrong dtype file", "holds int64"),
    ("wrong dtype listed", "does not match the rows kept"),
    ("offsets short", r"holds int64 \(2,\), shmbuf.json says int64 \(7,\)"),
    ("rows listed wrong", "does not match the rows kept: 5 rows"),
    ("smaller arena", "more than its arena"),
    ("values not listed", "lists the ragged values under 'ragged'"),
    ("a field missing", "must hold the ragged fields"),
    ("format 3", "format version 3 holds no ragged values"),
])
def test_a_damaged_save_is_refused_and_creates_nothing(name, tmp_path, damage, message):
    with shmbuf.Buffer.create(F, 16, name=name, arena=1 << 13, seed=1) as a:
        for k in range(10, 16):
            a.add(row(k))
        a.save(tmp_path / "s")
    d, meta = damaged(tmp_path, "s")
    r, lp = meta["ragged"][0], meta["ragged"][1]
    o = np.load(d / r["offsets"])
    if damage == "offsets down":
        o[2], o[3] = o[3], o[2]
        npy(d, r["offsets"], o)
    elif damage == "values short":
        npy(d, r["values"], np.load(d / r["values"])[:-1])
        r["shape"] = [r["shape"][0] - 1]
    elif damage == "lengths disagree":  # (lp's rows: other lengths, the same total)
        lo = np.load(d / lp["offsets"])
        lo[1:-1] = lo[2:]
        npy(d, lp["offsets"], lo)
    elif damage == "wrong dtype file":
        npy(d, r["values"], np.load(d / r["values"]).astype(np.int64))
    elif damage == "wrong dtype listed":
        npy(d, r["values"], np.load(d / r["values"]).astype(np.int64))
        r["dtype"] = "<i8"
    elif damage == "offsets short":
        npy(d, r["offsets"], o[:2])
    elif damage == "rows listed wrong":
        npy(d, r["offsets"], o[:-1])  # (the last row left out: 5 rows for the 6 kept)
        npy(d, r["values"], np.load(d / r["values"])[:o[-2]])
        r["rows"], r["shape"] = r["rows"] - 1, [int(o[-2])]
    elif damage == "smaller arena":
        meta["meta"]["parts"]["ragged"]["arena"] = 128
    elif damage == "values not listed":
        del meta["ragged"]
    elif damage == "a field missing":
        meta["ragged"].pop(2)
    elif damage == "format 3":
        meta["format_version"] = 3
    (d / "shmbuf.json").write_text(json.dumps(meta))
    before = segment.list_names()
    with pytest.raises(ValueError, match=message):
        shmbuf.Buffer.load(d, name=name + "-l")
    assert segment.list_names() == before  # (nothing created, nothing left)


def test_a_save_of_format_3_without_ragged_fields_still_loads(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((2,), np.float32)}, 8, name=name) as a:
        a.extend({"x": np.ones((3, 2))})
        a.save(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "shmbuf.json").read_text())
    assert meta["format_version"] == persist.FORMAT_VERSION == 3 and "ragged" not in meta
    with shmbuf.Buffer.load(tmp_path / "s", name=name + "-l") as b:
        assert len(b) == 3
        b.unlink()


def saved_rows(d) -> dict:
    """Every row a save holds, read from its files alone (fixed fields at the slots its
    stamps keep, ragged fields from their values and offsets)."""
    meta = json.loads((d / "shmbuf.json").read_text())
    kept = np.flatnonzero(np.load(d / "stamps.npy", allow_pickle=False))
    out = {f["name"]: np.load(d / f["file"], allow_pickle=False)[kept] for f in meta["fields"]
           if not f["name"].startswith("_")}
    for r in meta["ragged"]:
        out[r["name"]] = Jagged(np.load(d / r["values"], allow_pickle=False),
                                np.load(d / r["offsets"], allow_pickle=False))
    return out


def test_saves_beside_writer_processes_hold_only_whole_rows(name, tmp_path):
    """Two writer processes wrap their lanes' small arenas again and again while the
    buffer is saved and loaded: every row of every save (read from its files) and of
    every load is whole, whatever the saves left out."""
    stop = str(tmp_path / "stop")
    with shmbuf.Buffer.create(RAGGED_FIELDS, 64, lanes=2, name=name, arena=2 * 4096) as buf:
        logs = [str(tmp_path / f"w{w}.log") for w in range(2)]
        procs = [CTX.Process(target=ragged_writer, args=(name, w, w, None, logs[w], stop)) for w in range(2)]
        for p in procs:
            p.start()
        try:
            deadline = time.monotonic() + 60
            while not all(sum(t == "W" for t, _ in read_log(log)) >= 20 for log in logs):
                assert time.monotonic() < deadline and all(p.is_alive() for p in procs)
                time.sleep(0.01)
            kept = 0
            for k in range(6):
                summary = buf.save(tmp_path / f"s{k}")
                rows = saved_rows(tmp_path / f"s{k}")
                assert len(rows["w"]) == summary["rows"] and ragged_torn(rows) == 0
                with shmbuf.Buffer.load(tmp_path / f"s{k}", name=f"{name}-{k}") as b:
                    assert len(b) == summary["rows"]
                    if len(b):
                        assert ragged_torn(b.sample(200)) == 0
                    b.unlink()
                kept += summary["rows"]
            assert kept > 0
        finally:
            open(stop, "w").close()
            for p in procs:
                p.join(60)
        assert [p.exitcode for p in procs] == [0, 0]
