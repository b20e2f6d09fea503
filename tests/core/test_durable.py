"""What a buffer in a file keeps: after processes are killed (everything published), and
after a restart of the machine (the rows of the last flush; see shmbuf.core.durable).

A restart is simulated by writing another boot id into the header: the next open then
does exactly what the first open after a real restart does."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

import shmbuf
from helpers import STORM, storm_rows, storm_torn, storm_writer, wait_for_file, write_and_hang
from shmbuf.core import durable
from shmbuf.core.layout import CTRL_BOOT, CTRL_FLUSHES, LANE_CLAIM_PID, LANE_FLUSHED, RES_PID, published


def restart(buf) -> None:
    """Make the next open of ``buf``'s file see another boot, then close ``buf``."""
    buf.engine.ring.control[CTRL_BOOT] = durable.boot_id() ^ 0x5A5A
    buf.close()


def values(buf, n: int = 500) -> set:
    return set(buf.sample(n)["x"].tolist()) if len(buf) else set()


@pytest.fixture
def steady_lead(monkeypatch):
    """The horizon's lead stays a sixteenth of a lane, however fast the test writes."""
    monkeypatch.setattr(durable.Horizon, "FAST", -1.0)


def test_a_restart_keeps_the_rows_of_the_last_flush_and_drops_the_rest(tmp_path, steady_lead):
    p = str(tmp_path / "b.shmbuf")
    buf = shmbuf.Buffer.create({"x": ((), "int64")}, 64, path=p, lanes=2)  # lanes of 32: a lead of 2
    h = buf.engine.ring.horizon
    buf.extend({"x": np.arange(30)}, lane=0)
    buf.extend({"x": np.arange(100, 104)}, lane=1)
    assert h.tolist() == [[32, 32], [6, 6]]  # each write's rows, and 32 // 16 more
    buf.flush()
    assert buf.engine.ring.lane_table[:, LANE_FLUSHED].tolist() == [30, 4]
    buf.extend({"x": np.arange(30, 34)}, lane=0)  # after the flush: reuses the slots of rows 0, 1
    buf.extend({"x": np.arange(104, 106)}, lane=1)  # after the flush, no slot reused
    assert h.tolist() == [[36, 36], [6, 6]]
    restart(buf)
    back = shmbuf.Buffer.attach(p)
    # lane 0: rows 4..29. Rows 0 and 1 were overwritten after the flush; writes could have
    # reached the slots of rows 2 and 3 (the horizon on the disk, 36); 30..33 came after it.
    assert back.lane_sizes() == [26, 4] and len(back) == 30
    assert values(back, 4000) == set(range(4, 30)) | set(range(100, 104))
    stamps = back.engine.ring.stamps
    assert stamps[:32].tolist() == [0] * 4 + [published(s) for s in range(4, 30)] + [0, 0]
    back.extend({"x": np.arange(50, 53)}, lane=0)  # the run goes on from row 30 of lane 0
    assert values(back, 4000) == set(range(4, 30)) | {50, 51, 52} | set(range(100, 104))
    back.unlink()
    back.close()


@pytest.mark.parametrize("shared", [False, True], ids=["owner", "shared"])
def test_the_horizon_is_on_the_disk_before_any_write_may_use_it(tmp_path, monkeypatch, shared, steady_lead):
    """Both write paths refuse to reserve past the usable horizon; moving it writes the
    new value to the disk while the usable word still holds the old one."""
    from shmbuf.core.files import FileSegment
    p = str(tmp_path / "b.shmbuf")
    buf = shmbuf.Buffer.create({"x": ((), "int64")}, 2 * 160, path=p, lanes=2)
    h, heads = buf.engine.ring.horizon, buf.engine.ring.lane_table[:, 0]
    if not shared:
        buf.claim_lane(0)
    seen = []
    real = FileSegment.sync

    def sync(self, start=0, stop=None):
        seen.append((int(h[0, 0]), int(h[0, 1]), int(heads[0])))
        real(self, start, stop)
    monkeypatch.setattr(FileSegment, "sync", sync)
    for i in range(100):
        buf.add({"x": i}, lane=0)
        assert heads[0] <= h[0, 1] <= h[0, 0]
    buf.extend({"x": np.arange(30)}, lane=0)
    assert len(seen) == 10 + 1  # every 160 // 16 rows, and the batch of 30 that passed it
    for disk, usable, head in seen:
        assert head <= usable < disk  # on the disk first, usable after; no write went past it


def test_the_lead_doubles_for_a_lane_written_fast_and_halves_back(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(durable.time, "monotonic", lambda: clock[0])
    buf = shmbuf.Buffer.create({"x": ((), "int64")}, 1024, path=str(tmp_path / "b.shmbuf"))
    h, reach = buf.engine.ring.horizon, buf.engine.ring.reach
    leads = []
    for step in [0.001] * 6 + [1.0] * 4:  # six moves 1 ms apart, then four 1 s apart
        clock[0] += step
        head = int(buf.engine.ring.lane_table[0, 0])
        buf.extend({"x": np.arange(int(h[0, 1]) - head + 1)})  # one row past the horizon
        leads.append(int(h[0, 1]) - int(buf.engine.ring.lane_table[0, 0]))
    assert leads == [64, 128, 256, 512, 512, 512, 256, 128, 64, 64]  # 1024 // 16 .. 1024 // 2
    assert reach.lead == [64]
    buf.unlink()
    buf.close()


def test_without_a_restart_nothing_is_rolled_back_and_a_never_flushed_file_keeps_nothing(tmp_path):
    p = str(tmp_path / "b.shmbuf")
    buf = shmbuf.Buffer.create({"x": ((), "int64")}, 8, path=p)
    buf.extend({"x": np.arange(5)})
    buf.close()
    again = shmbuf.Buffer.attach(p)
    assert len(again) == 5  # the same boot: all published rows, flush or not
    restart(again)
    back = shmbuf.Buffer.attach(p)
    assert len(back) == 0 and int(back.engine.ring.control[CTRL_FLUSHES]) == 0
    with pytest.raises(ValueError, match="empty"):
        back.sample(1)
    back.unlink()
    back.close()


def test_a_flush_vouches_only_for_rows_no_live_writer_holds(tmp_path):
    p = str(tmp_path / "b.shmbuf")
    flag = str(tmp_path / "flag")
    buf = shmbuf.Buffer.create({"x": ((), "int64")}, 16, path=p)
    buf.extend({"x": np.arange(3)})
    child = mp.get_context("spawn").Process(target=write_and_hang, args=(p, "writing", flag))
    child.start()
    try:
        wait_for_file(flag, child)  # rows 3..6 reserved, being written
        buf.extend({"x": np.arange(7, 9)})  # rows 7, 8 published after them
        buf.flush()
        assert buf.engine.ring.lane_table[0, LANE_FLUSHED] == 3  # not past the live writer
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    buf.flush()  # the writer is dead: its rows will never be published; the frontier moves on
    assert buf.engine.ring.lane_table[0, LANE_FLUSHED] == 9
    restart(buf)
    back = shmbuf.Buffer.attach(p)
    assert values(back, 2000) == {0, 1, 2, 7, 8}  # the dead writer's rows never appear
    assert back.engine.ring.res[:, RES_PID].tolist() == [0] * len(back.engine.ring.res)
    back.unlink()
    back.close()


def test_a_restart_drops_claims_and_keeps_priorities_queues_and_episodes_usable(tmp_path):
    # a prioritized buffer: leaves of rows after the flush are dropped from the trees
    p = str(tmp_path / "p.shmbuf")
    buf = shmbuf.Buffer.create({"x": ((), "int64")}, 32, path=p, priority=0.6, lanes=2)
    buf.claim_lane(0)
    buf.extend({"x": np.arange(6)})
    b = buf.sample(4)
    buf.update_priorities(b["index"], np.full(4, 5.0))
    buf.flush()
    buf.extend({"x": np.arange(6, 10)})
    buf.sample(4)  # rows 6..9 enter the trees
    restart(buf)
    back = shmbuf.Buffer.attach(p)
    assert back.engine.ring.lane_table[:, LANE_CLAIM_PID].tolist() == [0, 0]
    assert values(back, 2000) == set(range(6))
    leaves = back.engine.priorities.seq
    assert sorted(leaves[leaves > 0].tolist()) == list(range(1, 7))  # no leaf of a dropped row
    back.extend({"x": [77]}, lane=1)
    assert values(back, 4000) == set(range(6)) | {77}
    back.unlink()
    back.close()
    # a queue: the rows of the flush not yet taken are delivered, those after it dropped
    q = str(tmp_path / "q.shmbuf")
    buf = shmbuf.Buffer.create({"x": ((), "int64")}, 16, path=q, mode="queue")
    buf.extend({"x": np.arange(6)})
    assert buf.take(2)["x"].tolist() == [0, 1]
    buf.flush()
    buf.extend({"x": np.arange(6, 8)})
    assert buf.take(2)["x"].tolist() == [2, 3]
    restart(buf)
    back = shmbuf.Buffer.attach(q)
    assert back.take(10, partial=True)["x"].tolist() == [4, 5]
    back.unlink()
    back.close()
    # an episode buffer: the episode cut by the rollback is never sampled as a whole one
    e = str(tmp_path / "e.shmbuf")
    ebuf = shmbuf.EpisodeBuffer.create({"obs": ((1,), "float32"), "reward": ((), "float32")}, 32, path=e)
    ebuf.add_episode({"obs": np.arange(3, dtype=np.float32)[:, None], "reward": np.ones(3, np.float32),
                      "next_obs": np.arange(1, 4, dtype=np.float32)[:, None]})
    ebuf.flush()
    ebuf.add_episode({"obs": np.arange(10, 14, dtype=np.float32)[:, None], "reward": np.ones(4, np.float32),
                      "next_obs": np.arange(11, 15, dtype=np.float32)[:, None]})
    ebuf.engine.ring.control[CTRL_BOOT] = durable.boot_id() ^ 1
    ebuf.close()
    back = shmbuf.EpisodeBuffer.attach(e)
    assert back.num_episodes == 1
    assert [ep["obs"][:3, 0].tolist() for ep in back.sample_episodes(3)] == [[0, 1, 2]] * 3
    back.unlink()
    back.close()


def _storm_and_hang(path: str, flag: str) -> None:
    from helpers import hang_at
    hang_at("writing", flag)
    buf = shmbuf.Buffer.attach(path)
    buf.extend(storm_rows(99, np.arange(5)))


def _drop_page_cache() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


@pytest.mark.timeout(300)
def test_every_process_killed_mid_storm_then_a_restart_leaves_only_whole_rows(tmp_path):
    """Three writers storm one lane while a fourth is stopped inside a write; the test
    flushes while they write, then SIGKILLs every one of them (nobody closes anything).
    Re-attached, with the page cache dropped where permitted (the pages then come from
    the disk): every row whole, len as the lanes say. Then a simulated restart: only rows
    below the flush's frontiers, every one whole, and the run goes on."""
    p = str(tmp_path / "storm.shmbuf")
    flag = str(tmp_path / "flag")
    lc = 1024
    buf = shmbuf.Buffer.create(STORM, 4 * lc, path=p, lanes=4)
    ctx = mp.get_context("spawn")
    ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    hung = ctx.Process(target=_storm_and_hang, args=(p, flag))
    hung.start()
    wait_for_file(flag, hung)
    writers = [ctx.Process(target=storm_writer, args=(p, w, 7, 600.0, ready, stop, results)) for w in range(3)]
    for w in writers:
        w.start()
    ready.set()
    heads = buf.engine.ring.lane_table[:, 0]

    def wait_for(rows: int) -> None:  # rows reserved in all (the writers never stop by themselves)
        deadline = time.monotonic() + 200
        while int(heads.sum()) < rows:
            assert time.monotonic() < deadline and all(w.is_alive() for w in writers)
            time.sleep(0.01)

    wait_for(5 + 2 * lc)  # the writers' lane has wrapped
    front = durable.flush(buf.engine.ring, buf.engine.seg, 30)  # while they write
    wait_for(int(front.sum()) + 1)  # and went on after it
    for proc in writers + [hung]:
        os.kill(proc.pid, signal.SIGKILL)
    for proc in writers + [hung]:
        proc.join(30)
    buf.close()
    dropped = _drop_page_cache()
    back = shmbuf.Buffer.attach(p)
    assert len(back) == sum(back.lane_sizes()) > 0
    assert storm_torn(back.sample(2000)) == 0, f"torn rows after the kill (page cache dropped: {dropped})"
    restart(back)
    back = shmbuf.Buffer.attach(p)
    ring = back.engine.ring

    lc = back.lane_capacity
    for lane in range(4):
        st = ring.stamps[lane * lc:(lane + 1) * lc]
        kept = st[st != 0]
        assert (kept % 2 == 0).all() and (kept <= published(front[lane] - 1)).all()
    assert len(back) == sum(back.lane_sizes()) <= int(front.sum())  # (0 if a lap came after the flush)
    if len(back):
        assert storm_torn(back.sample(2000)) == 0
    back.extend(storm_rows(7, np.arange(100)), lane=1)
    assert storm_torn(back.sample(2000)) == 0 and len(back) == sum(back.lane_sizes())
    back.unlink()
    back.close()


class Disk:
    """What a buffer file's disk holds, page by page: each ``sync`` of the file's segment
    copies the pages it covers; :meth:`power_loss` writes a file whose every page not
    synced since ``since`` is, at random, the one on the disk or the one in memory (the
    kernel writes dirty pages back in no order), and whose boot id is another boot's."""

    def __init__(self, buf, monkeypatch) -> None:
        self.buf, self.path = buf, buf.engine.seg.name
        with open(self.path, "rb") as f:
            self.bytes = bytearray(f.read())  # (after a flush: everything on the disk)
        self.synced = np.zeros(-(-len(self.bytes) // 4096), bool)
        seg = buf.engine.seg
        sync = seg.sync

        def recording(start: int = 0, stop: int | None = None) -> None:
            sync(start, stop)
            lo, hi = start // 4096, -(-(len(self.bytes) if stop is None else stop) // 4096)
            now = self.memory()
            self.bytes[lo * 4096:hi * 4096] = now[lo * 4096:hi * 4096]
            self.synced[lo:hi] = True
        monkeypatch.setattr(seg, "sync", recording)

    def memory(self) -> bytes:
        return bytes(self.buf.engine.seg.mmap[:len(self.bytes)])

    def power_loss(self, dest: str, rng: np.random.Generator) -> str:
        now = self.memory()
        out = bytearray(self.bytes)
        for page in np.flatnonzero(~self.synced & rng.integers(0, 2, len(self.synced)).astype(bool)).tolist():
            out[page * 4096:(page + 1) * 4096] = now[page * 4096:(page + 1) * 4096]
        boot = self.buf.engine.layout.control_offset + 8 * CTRL_BOOT
        out[boot:boot + 8] = np.int64(durable.boot_id() ^ 0x5A5A).tobytes()
        with open(dest, "wb") as f:
            f.write(out)
        return dest


ROW = {"x": ((700,), "int64")}  # 5.6 KB rows: most of them cross a page boundary


def _rows(lo: int, hi: int, base: int) -> dict:
    return {"x": np.repeat(np.arange(lo, hi)[:, None] + base, 700, axis=1)}


def _whole(path: str) -> tuple[int, int]:
    """(rows, torn rows) of the buffer file ``path`` once it recovered: a row is whole
    if its 700 values are one value."""
    with shmbuf.Buffer.attach(path) as b:
        if not len(b):
            n, torn = 0, 0
        else:
            x = b.sample(400)["x"]
            n, torn = len(b), int((x != x[:, :1]).any(axis=1).sum())
        b.unlink()
    return n, torn


@pytest.mark.parametrize("when", ["during", "after"])
def test_a_power_loss_during_or_after_a_restore_of_a_file_leaves_no_torn_row(tmp_path, monkeypatch, when):
    """The restore overwrites slots in place: the disk must stop vouching for the old rows
    before the first one changes, and vouch for the restored ones once it returns."""
    src = shmbuf.Buffer.create(ROW, 48, name=f"t{os.getpid()}-restore-src-{when}")
    src.extend(_rows(0, 40, 1000))
    state = src.state_dict()
    src.close()
    p = str(tmp_path / "b.shmbuf")
    buf = shmbuf.Buffer.create(ROW, 48, path=p)
    buf.extend(_rows(0, 48, 0))
    buf.flush()
    disk = Disk(buf, monkeypatch)
    rng = np.random.default_rng(7)
    if when == "during":
        from shmbuf.core import contents
        restore = contents.restore

        def cut(*args, **kw):  # the power goes halfway through the rows' copy
            def progress(nbytes):
                if not getattr(progress, "done", False):
                    progress.done = True
                    for k in range(20):
                        disk.power_loss(str(tmp_path / f"lost{k}.shmbuf"), rng)
            return restore(*args, **{**kw, "chunk_bytes": 8 * 5608, "progress": progress})
        monkeypatch.setattr(contents, "restore", cut)
    buf.load_state_dict(state)
    if when == "after":
        for k in range(20):
            disk.power_loss(str(tmp_path / f"lost{k}.shmbuf"), rng)
    buf.unlink()
    buf.close()
    results = [_whole(str(tmp_path / f"lost{k}.shmbuf")) for k in range(20)]
    assert sum(t for _, t in results) == 0, results
    if when == "after":
        assert all(n == 40 for n, _ in results), results  # the restore is durable once it returned
