"""Real processes: every start method, a fresh interpreter, exits, crashes, ownership."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import shmbuf
from conftest import shm_path
from helpers import report_rows, write_range

METHODS = ["fork", "spawn", "forkserver"]


def exists(name: str) -> bool:
    return os.path.exists(name if "/" in name else shm_path(name))


def run_python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.both_storages
@pytest.mark.parametrize("method", METHODS)
def test_child_attaches_by_name_and_by_pickle(name, method, storage):
    ctx = mp.get_context(method)
    with shmbuf.Buffer.create({"x": ((), "int64")}, 16, name=name) as buf:
        buf.extend({"x": np.arange(10)})
        q = ctx.Queue()
        for target, arg in ((report_rows, name), (_report_handle, buf)):
            p = ctx.Process(target=target, args=(arg, q))
            p.start()
            size, rows = q.get(timeout=60)
            p.join(60)
            assert p.exitcode == 0
            assert size == 10 and set(rows) <= set(range(10)) and len(set(rows)) > 5
        # children write; the parent sees their rows
        procs = [ctx.Process(target=write_range, args=(name, 100 + 3 * i, 103 + 3 * i)) for i in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        assert len(buf) == 16 and buf.is_full
        assert set(buf.sample(2000)["x"].tolist()) >= set(range(100, 106))
    assert exists(name) is (storage == "file")  # (a file is persistent)


def _report_handle(buf, q):
    q.put((len(buf), sorted(buf.sample(200)["x"].tolist())))
    buf.close()


@pytest.mark.both_storages
def test_fresh_interpreter_attaches_by_name_only(name, storage):
    with shmbuf.Buffer.create({"x": ((2,), "float32")}, 8, name=name) as buf:
        buf.extend({"x": np.arange(10, dtype=np.float32).reshape(5, 2)})
        res = run_python("""
            import sys, shmbuf
            b = shmbuf.Buffer.attach(sys.argv[1])
            print(len(b), b.capacity, b.fields["x"][0], sorted({tuple(r) for r in b.sample(300)["x"].tolist()}))
            b.add({"x": [-1, -2]})
        """, name)
        assert res.returncode == 0, res.stderr
        assert res.stderr == ""  # no resource-tracker warning, nothing
        assert res.stdout.strip() == "5 8 (2,) [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0), (6.0, 7.0), (8.0, 9.0)]"
        assert len(buf) == 6 and buf.sample_sequences(1, 6)["x"][0, -1].tolist() == [-1, -2]
    assert exists(name) is (storage == "file")  # (a file is persistent)


@pytest.mark.both_storages
@pytest.mark.parametrize("how", ["exit", "SIGKILL"])
def test_attacher_exit_leaves_buffer_intact(name, how):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        buf.extend({"x": np.arange(5)})
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent("""
                import sys, time, shmbuf
                b = shmbuf.Buffer.attach(sys.argv[1])
                b.sample(3)
                print("ready", flush=True)
                if sys.argv[2] == "SIGKILL":
                    time.sleep(60)
            """), name, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        if how == "SIGKILL":
            proc.kill()
        _, err = proc.communicate(timeout=30)
        assert err == ""
        assert exists(name)
        assert len(buf) == 5 and set(buf.sample(200)["x"].tolist()) == set(range(5))
        again = shmbuf.Buffer.attach(name)
        assert len(again) == 5
        again.close()


CREATOR = """
    import os, signal, sys, numpy as np, shmbuf
    name, mode = sys.argv[1], sys.argv[2]
    buf = shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name, persist=(mode.startswith("persist")))
    buf.extend({"x": np.arange(6)})
    print("ready", flush=True)
    if mode.endswith("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    # otherwise: a normal exit without close()
"""


@pytest.mark.parametrize("mode", ["persist-exit", "persist-kill"])
def test_persistent_buffer_outlives_its_creator(name, mode):
    res = run_python(CREATOR, name, mode)
    assert res.stdout.strip() == "ready" and res.stderr == ""
    assert exists(name)
    buf = shmbuf.Buffer.attach(name)  # "the learner restarted"
    try:
        assert buf.persist and len(buf) == 6
        assert buf.sample_sequences(1, 6)["x"].tolist() == [list(range(6))]
    finally:
        buf.unlink()
        buf.close()
    assert not exists(name)


def test_creator_normal_exit_destroys_without_warnings(name):
    res = run_python(CREATOR, name, "owner-exit")
    assert res.stdout.strip() == "ready"
    assert res.stderr == ""
    assert not exists(name)


def test_crashed_creator_is_cleaned_up_by_resource_tracker(name):
    res = run_python(CREATOR, name, "owner-kill")
    assert res.returncode == -signal.SIGKILL and res.stdout.strip() == "ready"
    deadline = time.monotonic() + 20  # the tracker notices its last client is gone
    while exists(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not exists(name)


def test_forked_copy_of_the_owner_does_not_destroy_it(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        buf.add({"x": 1})
        pid = os.fork()
        if pid == 0:  # child: use the inherited handle, close it, exit normally
            try:
                buf.add({"x": 2})
                buf.close()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert exists(name) and len(buf) == 2
    assert not exists(name)
