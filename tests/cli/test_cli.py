"""The shmbuf command, run as a real subprocess."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys

import numpy as np

import shmbuf
from shmbuf.demo import run as demo
from shmbuf.demo.envs import CartPole

pytestmark = pytest.mark.one_path  # (scripts/test runs it on one path)


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
    assert bad.returncode == 1 and bad.stderr == f"shmbuf info: {name}: no such buffer (never created, or already removed)\n"


def test_problems_are_one_line_each_and_the_other_names_are_still_handled(name, tmp_path):
    other = name + "-b"
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, persist=True), \
            shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=other, persist=True):
        res = cli("rm", "bad:name", name, "missing-" + name, other)
        assert res.returncode == 1
        assert res.stdout.splitlines() == [f"removed {name}", f"removed {other}"]
        lines = res.stderr.splitlines()
        assert len(lines) == 2 and "Traceback" not in res.stderr
        assert lines[0].startswith("shmbuf rm: bad:name: invalid buffer name")
        assert lines[1] == f"shmbuf rm: missing-{name}: no such buffer"
    res = cli("info", "with\nnewline")
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "invalid buffer name" in res.stderr


def test_ls_skips_what_is_not_a_buffer_and_what_vanished(name, tmp_path, monkeypatch, capsys):
    import socket
    from shmbuf.core import segment
    from shmbuf import cli as cli_mod

    base = segment.SHM_DIR + "/" + segment.prefix()
    os.mkdir(base + name + "-dir")  # a directory named like a buffer
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(base + name + "-sock")  # a socket too
    half = segment.Segment.create(name + "-half", 4096)  # created, header never written
    try:
        with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name):
            res = cli("ls")
            assert res.returncode == 0 and "Traceback" not in res.stderr
            assert name + "-dir" not in res.stdout and name + "-sock" not in res.stdout
            assert name + "-half" not in res.stdout  # no magic yet: not known to be a buffer
            res = cli("info", name + "-half")  # (info explains any name)
            assert res.returncode == 1 and "did not become a complete buffer" in res.stderr
            # a buffer that is removed between the listing and its description is left out
            real = segment.list_names
            monkeypatch.setattr(segment, "list_names", lambda: ["gone-" + name] + real())
            assert cli_mod.main(["ls"]) == 0
            out = capsys.readouterr()
            assert "gone-" not in out.out and name in out.out and out.err == ""
            monkeypatch.setattr(segment, "unlink_name", _raise(PermissionError(1, "denied")))
            assert cli_mod.main(["rm", name]) == 1
            assert capsys.readouterr().err == (f"shmbuf rm: {name}: permission denied: this user may not read "
                                               "or remove it; nothing was removed\n")
    finally:
        os.rmdir(base + name + "-dir")
        sock.close()
        os.unlink(base + name + "-sock")
        half.unlink()
        half.close()


def _raise(exc):
    def f(*args, **kwargs):
        raise exc
    return f


def test_help_version_and_demo_help():
    res = cli("--help")
    assert res.returncode == 0 and "``" not in res.stdout and "Exit status" in res.stdout
    assert cli("--version").stdout.strip() == f"shmbuf {shmbuf.__version__}"
    demo_help = cli("demo", "--help").stdout
    assert "torn" in demo_help and "CartPole envs per worker" in demo_help


def test_demo_runs_and_reports(name):
    res = cli("demo", "--seconds", "1.5", "--envs", "4", "--capacity", "5000")
    assert res.returncode == 0, res.stderr
    table = {cells[0]: cells[1] for cells in
             ([c.strip() for c in line.strip().strip("|").split("|")] for line in res.stdout.splitlines())
             if len(cells) == 2}  # widths depend on the figures: compare cells, not columns
    assert table["torn rows detected"] == "0" and table["wrong next observations"] == "0"
    assert int(table["steps written"].replace(",", "")) > 0
    assert int(table["sampled transitions checked"].replace(",", "")) > 0
    assert "return per episode: mean (min-max)" in table
    assert "resource_tracker" not in res.stderr and "leaked" not in res.stderr


def test_demo_checks_catch_a_row_mixed_from_two_and_a_wrong_next_observation():
    env = CartPole(2, seed=1)
    obs = env.obs
    nxt, r, term, trunc = env.step(np.array([0, 1]))
    rows = {"obs": obs, "action": np.array([0, 1]), "reward": r, "next_obs": nxt}
    check = demo.checksum(rows)
    mixed = dict(rows, obs=rows["obs"][::-1].copy())
    assert (demo.checksum(mixed) != check).all()
    assert not demo.wrong_next(rows).any()
    assert demo.wrong_next(dict(rows, next_obs=nxt[::-1].copy())).all()


def test_cartpole_terminates_and_resets():
    env = CartPole(4, seed=0)
    ends = 0
    for _ in range(300):
        _, _, term, trunc = env.step(np.ones(4, np.int64))  # always push right: falls quickly
        ends += int(term.sum())
        assert not trunc.any()
    assert ends > 4 and (np.abs(env.state[:, 0]) <= 2.4 + 1).all()


def test_ls_lists_only_shmbuf_segments_and_damaged_ones_with_their_error(name):
    """Round 2, item 19: other programs' segments and empty files in /dev/shm are not
    listed; a segment with a buffer's magic but a damaged header is, with its error."""
    from shmbuf.core import layout, segment

    base = segment.SHM_DIR + "/" + segment.prefix()
    with open(base + name + "-empty", "wb"), open(base + name + "-other", "wb") as other:
        other.write(b"not a buffer" * 100)
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name + "-bad", persist=True):
        pass
    with open(base + name + "-bad", "r+b") as f:
        f.seek(8)
        f.write((99).to_bytes(4, "little"))  # format version 99
    try:
        with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name):
            res = cli("ls")
            assert res.returncode == 0 and res.stderr == "" and name in res.stdout
            assert name + "-empty" not in res.stdout and name + "-other" not in res.stdout
            row = [line for line in res.stdout.splitlines() if line.startswith(name + "-bad")]
            assert len(row) == 1 and "unusable" in row[0] and "format version 99" in row[0]
            listed = {d["name"]: d for d in json.loads(cli("ls", "--json").stdout)}
            assert set(listed) >= {name, name + "-bad"} and not {name + "-empty", name + "-other"} & set(listed)
            assert "format version 99" in listed[name + "-bad"]["error"]
            res = cli("info", name + "-other")
            assert res.returncode == 1 and "bad magic" in res.stderr and res.stderr.count("\n") == 1
    finally:
        for n in ("-empty", "-other", "-bad"):
            segment.unlink_name(name + n)
    assert layout.MAGIC not in (b"", b"not a bu")


def test_ls_dir_info_stat_and_rm_of_buffer_files(tmp_path):
    p = str(tmp_path / "a.shmbuf")
    with shmbuf.Buffer.create({"x": ((), "int64")}, 16, path=p) as buf:
        buf.extend({"x": np.arange(5)})
        buf.flush()
    (tmp_path / "notes.txt").write_text("not a buffer")
    res = cli("ls", str(tmp_path))
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 2
    assert res.stdout.splitlines()[1].split()[:4] == [p, "buffer", "5", "16"]
    info = json.loads(cli("info", p).stdout)
    assert info["name"] == p and info["storage"] == "file" and info["flushes"] == 1 and info["rows"] == 5
    assert cli("stat", p).stdout.startswith(f"{p}: 5 of 16 rows")
    bad = cli("rm", str(tmp_path / "notes.txt"))
    assert bad.returncode == 1 and "not a shmbuf buffer file" in bad.stderr
    assert (tmp_path / "notes.txt").exists()
    assert cli("rm", p).stdout == f"removed {p}\n" and not os.path.exists(p)
    gone = cli("ls", str(tmp_path), str(tmp_path / "nowhere"))
    assert gone.returncode == 1 and gone.stdout.startswith("no shmbuf buffers in")
    assert "nowhere: not a directory" in gone.stderr

