"""shmbuf.Actors: actor processes writing while the learner samples, stopped, restarted."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import shmbuf
from helpers import actors as fns
from helpers.processes import wait_for_file

pytestmark = pytest.mark.one_path


def test_actors_write_their_own_lanes_report_and_stop(name, tmp_path):
    buf = shmbuf.Buffer.create(fns.FIELDS, 64, lanes=2, name=name, seed=0)
    with shmbuf.Actors(fns.write_then_park, buf, 2, seed=7, args=(str(tmp_path),)) as actors:
        got = actors.wait_reports(2, timeout=60)
        assert sorted((r["actor"], r["seed"], r["restarts"]) for r in got) == [(0, 7, 0), (1, 1007, 0)]
        assert all(actors.alive)
        owners = {int(who) for who in buf.sample(64)["who"]}
        assert owners == {0, 10} and sorted(buf.lane_sizes()) == [5, 5]
    assert not any(actors.alive)  # stopped when asked: none had to be killed
    assert [d["claimed_by"] for d in buf.stats()["lanes"]] == [None, None]  # their lanes given back
    buf.close()


def test_a_killed_actor_is_restarted_into_its_lane(name, tmp_path):
    """An actor SIGKILLed at a chosen point (after its rows, while it holds its lane):
    reports() starts it again, and the new one claims the dead one's lane, so the lane
    takes new rows instead of freezing."""
    buf = shmbuf.Buffer.create(fns.FIELDS, 64, lanes=2, name=name, seed=0)
    with shmbuf.Actors(fns.write_then_park, buf, 2, args=(str(tmp_path),)) as actors:
        wait_for_file(tmp_path / "0-0", actors.processes[0])
        wait_for_file(tmp_path / "1-0", actors.processes[1])
        pid = int((tmp_path / "0-0").read_text())
        lane = next(d["lane"] for d in buf.stats()["lanes"] if d["claimed_by"] == pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while actors.restarts[0] == 0:  # reports() notices the death and restarts it
            assert time.monotonic() < deadline
            actors.reports()
            time.sleep(0.01)
        wait_for_file(tmp_path / "0-1", actors.processes[0])
        new = int((tmp_path / "0-1").read_text())
        assert new != pid and buf.stats()["lanes"][lane]["claimed_by"] == new
        assert buf.lane_sizes()[lane] == 10  # its 5 rows, then the new actor's 5
        assert {int(w) for w in buf.sample(256)["who"]} == {0, 1, 10}
    buf.close()


def test_without_restart_a_dead_actor_stays_dead(name, tmp_path):
    buf = shmbuf.Buffer.create(fns.FIELDS, 64, lanes=1, name=name)
    with shmbuf.Actors(fns.fail, buf, 1, restart=False) as actors:
        actors.processes[0].join(60)
        assert actors.reports() == [] and actors.restarts == [0] and actors.processes[0].exitcode == 1
    buf.close()


def test_retry_waits_under_a_rate_limit_and_gives_up_when_stopped(name):
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1.0, error_buffer=4.0)
    buf = shmbuf.Buffer.create(fns.FIELDS, 64, lanes=1, name=name, rate=rate, seed=0)
    with shmbuf.Actors(fns.add_under_the_limit, buf, 1) as actors:
        deadline = time.monotonic() + 60
        while buf.total_added < 3:  # the limit lets a few rows in, then holds the actor back
            assert time.monotonic() < deadline
            time.sleep(0.01)
        held = buf.total_added
        buf.sample(2)  # two samples let two more rows in
        while buf.total_added < held + 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        actors.stop()  # the actor is inside retry(): it returns False instead of waiting on
        got = actors.reports()
    assert not any(actors.alive) and actors.processes[0].exitcode == 0
    assert got == [{"actor": 0, "added": buf.total_added}]
    buf.close()


def test_actors_pull_the_newest_weights(name):
    params = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(1, np.float32)}
    w = shmbuf.Weights.create(name + "-w", params)
    buf = shmbuf.Buffer.create(fns.FIELDS, 8, name=name)
    with shmbuf.Actors(fns.pull_weights, buf, 1, weights=w) as actors:
        w.publish({**params, "b": np.array([3.5], np.float32)})
        (got,) = actors.wait_reports(1, timeout=60)
    assert got == {"actor": 0, "version": 1, "bias": 3.5}
    w.close()
    buf.close()


def test_stop_ends_an_actor_that_ignores_it(name):
    buf = shmbuf.Buffer.create(fns.FIELDS, 8, name=name)
    actors = shmbuf.Actors(fns.ignore_the_stop, buf, 1)
    t = time.monotonic()
    actors.stop(timeout=0.5)
    assert not any(actors.alive) and time.monotonic() - t < 30
    buf.close()


def test_stop_gives_actors_that_ignore_sigterm_one_grace_together(name, tmp_path):
    """Four actors ignore the stop and SIGTERM: stop(timeout=0.5) waits 0.5 s for them,
    terminates them all, waits TERM_GRACE (2 s) for them all, then kills them. It used to
    wait 2 s for each in turn (8.5 s for four)."""
    from shmbuf.actors.processes import TERM_GRACE
    buf = shmbuf.Buffer.create(fns.FIELDS, 8, lanes=4, name=name)
    actors = shmbuf.Actors(fns.ignore_stop_and_sigterm, buf, 4, args=(str(tmp_path),))
    for i, p in enumerate(actors.processes):
        wait_for_file(tmp_path / str(i), p)
    t = time.monotonic()
    actors.stop(timeout=0.5)
    elapsed = time.monotonic() - t
    assert not any(actors.alive)
    assert elapsed < 0.5 + TERM_GRACE + 2.5, elapsed  # (four graces in turn: 8.5 s)
    buf.close()


def test_bad_arguments_are_refused(name):
    buf = shmbuf.Buffer.create(fns.FIELDS, 8, name=name)
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        shmbuf.Actors(fns.fail, buf, 0)
    buf.close()


def _gone(pid: int) -> bool:
    """The process ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("obey", [True, False], ids=["obeying", "ignoring-the-stop"])
def test_actors_of_a_learner_killed_by_sigkill_exit_and_nothing_stays(name, tmp_path, obey):
    """The learner is SIGKILLed with its actors running: they see it gone (``stopped``),
    or, ignoring that, are ended after the grace; the segment is removed (its resource
    tracker's last holders were the actors)."""
    import subprocess
    import sys
    # a learner started from a shell: its own resource tracker (a spawned child uses its parent's)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # (where helpers/ is)
    learner = subprocess.Popen(
        [sys.executable, "-c", "import sys; from helpers.actors import learner_then_hang; "
         "learner_then_hang(sys.argv[1], sys.argv[2], sys.argv[3] == '1')", name, str(tmp_path), str(int(obey))],
        env={**os.environ, "PYTHONPATH": tests + os.pathsep + os.environ.get("PYTHONPATH", "")})
    try:
        wait_for_file(tmp_path / "actors", learner, "the learner to start its actors")
        pids = [int(p) for p in (tmp_path / "actors").read_text().split()]
    finally:
        learner.kill()
        learner.wait(30)
    from shmbuf.core.segment import SHM_DIR, os_name
    seg = SHM_DIR + os_name(name)
    deadline = time.monotonic() + 120
    while not all(_gone(p) for p in pids) or os.path.exists(seg):
        if time.monotonic() > deadline:
            for p in pids:
                if not _gone(p):
                    os.kill(p, signal.SIGKILL)
            pytest.fail(f"actors {[p for p in pids if not _gone(p)]} outlived their learner, or the "
                        f"segment stayed: {os.path.exists(seg)}")
        time.sleep(0.05)


def test_an_actors_rows_carry_the_version_of_the_weights_it_last_pulled(name):
    """In a buffer created with versions=True, Actors binds each actor's handle to the
    actor: a row written before any pull is refused, then each row carries the version
    the actor had pulled when it wrote it (not the newest published)."""
    w = shmbuf.Weights.create(name + "-w", {"w": np.zeros(2)})
    buf = shmbuf.Buffer.create(fns.FIELDS, 8, name=name, versions=True)
    with shmbuf.Actors(fns.write_with_pulled_versions, buf, 1, weights=w) as actors:
        w.publish({"w": np.ones(2)})
        deadline = time.monotonic() + 60
        while len(buf) < 1 and time.monotonic() < deadline:  # (its row under version 1 is in)
            time.sleep(0.001)
        w.publish({"w": np.full(2, 2.0)})
        (got,) = actors.wait_reports(1, timeout=60)
    assert "pulled no weights yet" in got["refused"] and got["pulled"] == [1, 2]
    b = buf.sample(50)
    assert set(zip(b["t"].tolist(), b["version"].tolist())) == {(1, 1), (2, 2)}
    w.close()
    buf.close()
