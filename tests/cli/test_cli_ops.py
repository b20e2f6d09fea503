"""shmbuf stat / watch / save / load / gc against buffers of other processes."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import shmbuf
from shmbuf.core import segment

pytestmark = pytest.mark.one_path  # (scripts/test runs it on one path)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmbuf", *args], capture_output=True,
                          text=True, timeout=timeout)


OWNER = """
import sys, time, numpy as np, shmbuf
from multiprocessing import resource_tracker as rt
buf = shmbuf.Buffer.create({"x": ((), "int64")}, 64, lanes=2, name=sys.argv[1], persist=sys.argv[2] == "1")
buf.extend({"x": np.arange(10)}, lane=1)
buf.claim_lane(0)
buf.sample(4)
print(rt._resource_tracker._pid, flush=True)
time.sleep(600)
"""


class Owner:
    """A buffer created, written and sampled by another process, which then waits."""

    def __init__(self, name: str, persist: bool = False) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", OWNER, name, "1" if persist else "0"],
                                     stdout=subprocess.PIPE, text=True)
        self.tracker = int(self.proc.stdout.readline())

    def kill(self) -> None:
        """SIGKILL it and its resource tracker (first): nobody cleans up after it, as
        after a crash of the whole process tree (the test removes the segment itself)."""
        if self.proc.poll() is None:
            try:
                os.kill(self.tracker, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.kill()
            self.proc.wait(30)
            self.proc.stdout.close()


def test_stat_reads_another_processs_counters_and_sees_it_die(name):
    owner = Owner(name)
    try:
        res = cli("stat", name, "--json", "--interval", "0.05")
        assert res.returncode == 0, res.stderr
        s = json.loads(res.stdout)
        assert s["rows_inserted"] == 10 and s["batches_sampled"] == 1 and s["rows_sampled"] == 4
        assert s["lanes"][1]["writer_pid"] == owner.proc.pid and s["lanes"][1]["writer_alive"]
        assert s["lanes"][0]["writer_pid"] is None and set(s["rates"]) >= {"inserts/s", "batches/s"}
        assert [p["pid"] for p in s["processes"]] == [owner.proc.pid]  # the observer took no slot
        text = cli("stat", name, "--interval", "0.05").stdout
        assert f"{owner.proc.pid} (alive)" in text and "10 inserted" in text
        listed = {d["name"]: d for d in json.loads(cli("ls", "--json").stdout)}
        assert listed[name]["writers_alive"] == 1 and listed[name]["kind"] == "buffer"
        owner.kill()
        s = json.loads(cli("stat", name, "--json", "--interval", "0.05").stdout)
        assert s["lanes"][1]["writer_alive"] is False and not s["processes"][0]["alive"]
        assert s["lanes"][0]["claimed_by"] == owner.proc.pid and s["lanes"][0]["claim_alive"] is False
        listed = {d["name"]: d for d in json.loads(cli("ls", "--json").stdout)}
        assert listed[name]["writers_alive"] == 0  # its claim is left, but it is dead: not counted
        assert f"{owner.proc.pid} (dead)" in cli("stat", name, "--interval", "0.05").stdout
    finally:
        owner.kill()
        segment.unlink_name(name)
    bad = cli("stat", name)
    assert bad.returncode == 1 and bad.stderr.startswith(f"shmbuf stat: {name}: no such buffer")
    assert cli("stat").returncode == 2


def test_stats_count_in_every_process(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 64, name=name, seed=0) as buf:
        with shmbuf.Buffer.attach(name) as other:
            buf.extend({"x": np.arange(5)})
            other.add({"x": 1})
            other.sample(3)
            buf.sample_sequences(2, 2)
            s = buf.stats()
            assert s["rows_inserted"] == 6 and s["writes"] == 2
            assert s["batches_sampled"] == 2 and s["rows_sampled"] == 7
            (me,) = s["processes"]  # two handles, one process: one line
            assert me["pid"] == os.getpid() and me["alive"] and me["writes"] == 2
            assert other.engine.counters.index == buf.engine.counters.index > 0  # one slot, the process's
        s = buf.stats()  # a closed handle's counts are kept (in its process's slot)
        assert s["batches_sampled"] == 2 and s["processes"][0]["batches_sampled"] == 2
        for _ in range(100):  # handles opened and dropped, never closed: no slot more
            shmbuf.Buffer.attach(name).sample(1)
        assert sum(1 for i in range(1, 64) if buf.engine.counters.slots[i, 0]) == 1


def test_gc_removes_only_provably_orphaned_buffers(name):
    orphan, kept, live = Owner(name + "-o"), Owner(name + "-p", persist=True), Owner(name + "-l")
    try:
        orphan.kill()
        kept.kill()
        dry = cli("gc", "--dry-run")
        assert dry.returncode == 0 and f"would remove {name}-o" in dry.stdout
        assert name + "-p" not in dry.stdout and name + "-l" not in dry.stdout
        assert name + "-o" in segment.list_names()
        res = cli("gc")
        assert res.returncode == 0 and f"removed {name}-o (creator pid {orphan.proc.pid} is dead" in res.stdout
        names = segment.list_names()
        assert name + "-o" not in names and name + "-p" in names and name + "-l" in names
    finally:
        for o in (orphan, kept, live):
            o.kill()
        for n in (name + "-o", name + "-p", name + "-l"):
            segment.unlink_name(n)


def test_save_and_load_from_the_shell(name, tmp_path):
    owner = Owner(name)
    try:
        res = cli("save", name, str(tmp_path / "s"))
        assert res.returncode == 0 and "10 rows" in res.stdout, res.stderr
        assert cli("save", name, str(tmp_path / "s")).returncode == 1  # exists: no overwrite
        assert cli("save", name, str(tmp_path / "s"), "--overwrite").returncode == 0
        taken = cli("load", str(tmp_path / "s"))  # the saved name is the owner's, live
        assert taken.returncode == 1 and "already exists" in taken.stderr and taken.stderr.count("\n") == 1
        res = cli("load", str(tmp_path / "s"), name + "-r")
        assert res.returncode == 0, res.stderr
        with shmbuf.Buffer.attach(name + "-r") as r:  # outlived the command
            assert r.persist and len(r) == 10 and r.lane_sizes() == [0, 10]
        bad = cli("load", str(tmp_path / "nothing"), name + "-x")
        assert bad.returncode == 1 and "no shmbuf save" in bad.stderr
        assert cli("save", "missing-" + name, str(tmp_path / "t")).returncode == 1
    finally:
        owner.kill()
        segment.unlink_name(name + "-r")
        segment.unlink_name(name)


def test_ls_lists_weights(name):
    with shmbuf.Weights.create(name, {"w": np.zeros(3)}) as w:
        w.publish({"w": np.ones(3)})
        row = [line for line in cli("ls").stdout.splitlines() if line.startswith(name)]
        assert len(row) == 1 and "weights" in row[0] and "v1" in row[0]
        assert name not in cli("gc", "--dry-run").stdout


@pytest.mark.timeout(120)
def test_watch_redraws_in_a_real_terminal_until_ctrl_c(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 64, name=name) as buf:
        buf.extend({"x": np.arange(7)})
        pid, fd = pty.fork()
        if pid == 0:  # the child: shmbuf watch on the terminal, Ctrl-C as in a shell
            # (a background job of a non-interactive shell starts with SIGINT ignored, and
            # passes that on through exec: Python would then never raise KeyboardInterrupt)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(sys.executable, [sys.executable, "-m", "shmbuf", "watch", name, "--interval", "0.1"])
        out, added = b"", False
        deadline = time.monotonic() + 60
        after = f"{name}: 8 of 64 rows".encode()
        while after not in out and time.monotonic() < deadline:  # (frames may come several at once)
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    break
            if not added and b"\x1b[H\x1b[J" in out:
                buf.add({"x": 1})  # a change a later redraw shows
                added = True
        os.kill(pid, signal.SIGINT)
        # keep reading until it has exited: a child writing to a terminal nobody reads
        # blocks once the terminal's buffer is full (its last frames, its exit's flush)
        done, deadline = 0, time.monotonic() + 30
        while not done and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    out += os.read(fd, 65536)
                except OSError:  # EIO: its side of the terminal is closed
                    pass
            done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
        text = out.decode(errors="replace")
        assert done, f"shmbuf watch did not exit within 30 s of Ctrl-C; it wrote: {text[-2000:]!r}"
        assert text.count("\x1b[H\x1b[J") >= 2, text
        assert f"{name}: 7 of 64 rows" in text and f"{name}: 8 of 64 rows" in text
        assert "inserts/s" in text and "Traceback" not in text
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_slots_of_dead_processes_are_reclaimed_and_their_counts_kept(name):
    import psutil

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        c = buf.engine.counters
        for i in range(1, 64):  # every slot: a dead process that sampled 5 batches (this one's too)
            c.slots[i, 0], c.slots[i, 2] = dead_pid, 5
        with shmbuf.Buffer.attach(name) as other:
            assert other.engine.counters.index > 0  # a dead one's slot, taken
            assert int(c.slots[0, 2]) == 5  # its counts folded into the retired slot
            assert buf.stats()["batches_sampled"] == 63 * 5
        live_pid = os.getppid()  # every slot held by a live process (another one)
        for i in range(1, 64):
            c.slots[i, 0] = live_pid
            c.slots_f[i, 1] = psutil.Process(live_pid).create_time()
        with shmbuf.Buffer.attach(name) as third:
            assert third.engine.counters.index == 0  # the shared slot
            third.add({"x": 1})
            assert int(c.slots[0, 7]) == 1  # its write, counted there


def test_save_of_what_is_not_a_usable_buffer_is_one_line(name, tmp_path, monkeypatch, capsys):
    """Round 2, item 12: ``shmbuf save`` on another program's segment, a half-created one
    or another user's says why in one line (exit 1), never a traceback."""
    from shmbuf import cli as cli_mod
    from shmbuf.cli import show

    base = segment.SHM_DIR + "/" + segment.prefix()
    with open(base + name + "-other", "wb") as f:
        f.write(b"not a buffer" * 100)
    half = segment.Segment.create(name + "-half", 4096)  # created, header never written
    try:
        for target, why in ((name + "-other", "bad magic"), (name + "-half", "did not become a complete buffer")):
            res = cli("save", target, str(tmp_path / target))
            assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
            assert res.stderr.startswith(f"shmbuf save: {target}: ") and why in res.stderr
            assert res.stderr.count("\n") == 1 and not (tmp_path / target).exists()
        def denied(n):
            raise PermissionError(13, f"Permission denied: '/dev/shm/{n}'")
        monkeypatch.setattr(show, "observe", denied)
        assert cli_mod.main(["save", name, str(tmp_path / "s")]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"shmbuf save: {name}: ") and "Permission denied" in err and err.count("\n") == 1
    finally:
        segment.unlink_name(name + "-other")
        half.unlink()
        half.close()
