"""The shmbuf command, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

import shmbuf
from shmbuf import demo
from shmbuf.envs import CartPole


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmbuf", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_ls_info_rm(name):
    with shmbuf.Buffer.create({"x": ((3,), "float32")}, 10, name=name, lanes=2) as buf:
        buf.extend({"x": np.ones((4, 3))}, lane=1)
        res = cli("ls")
        assert res.returncode == 0 and name in res.stdout and "alive" in res.stdout
        info = json.loads(cli("info", name).stdout)
        assert info["rows"] == 4 and info["capacity"] == 10 and info["lane_rows"] == [0, 4]
        assert info["fields"] == {"x": [[3], "float32"]} and info["creator_alive"]
        listed = {d["name"]: d for d in json.loads(cli("ls", "--json").stdout)}
        assert listed[name]["total_added"] == 4
        res = cli("rm", name)
        assert res.returncode == 0 and f"removed {name}" in res.stdout
        assert cli("rm", name).returncode == 1
        buf.add({"x": [1, 2, 3]}, lane=0)  # still usable until closed
    bad = cli("info", name)
    assert bad.returncode != 0 and "no shared-memory buffer" in bad.stderr


def test_demo_runs_and_reports(name):
    res = cli("demo", "--seconds", "1.5", "--envs", "4", "--capacity", "5000")
    assert res.returncode == 0, res.stderr
    assert "| torn rows detected" in res.stdout and "|         0 |" in res.stdout.splitlines()[-1]
    assert "resource_tracker" not in res.stderr and "leaked" not in res.stderr


def test_demo_checksum_catches_a_row_mixed_from_two():
    env = CartPole(2, seed=1)
    nxt, r, term, trunc = env.step(np.array([0, 1]))
    rows = {"obs": env.obs, "action": np.array([0, 1]), "reward": r, "next_obs": nxt,
            "terminated": term, "truncated": trunc}
    check = demo.checksum(rows)
    mixed = dict(rows, obs=rows["obs"][::-1].copy())
    assert (demo.checksum(mixed) != check).all()


def test_cartpole_terminates_and_resets():
    env = CartPole(4, seed=0)
    ends = 0
    for _ in range(300):
        _, _, term, trunc = env.step(np.ones(4, np.int64))  # always push right: falls quickly
        ends += int(term.sum())
        assert not trunc.any()
    assert ends > 4 and (np.abs(env.state[:, 0]) <= 2.4 + 1).all()
