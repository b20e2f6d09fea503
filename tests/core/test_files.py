"""Buffers in files (shmbuf.core.files): making, naming, refusing, and a buffer larger
than the memory its process may use. What survives a restart: test_durable.py. Every
storm and kill test runs on files too (the both_storages marker)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import stat
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import shmbuf
from shmbuf.core import files
from shmbuf.core.files import FileSegment
from shmbuf.core.segment import FormatError


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "replay.shmbuf")


def test_a_file_buffer_is_made_attached_by_path_and_outlives_every_handle(path):
    buf = shmbuf.Buffer.create({"x": ((), "int64"), "img": ((32, 32), "uint8")}, 64, path=path, lanes=2)
    assert buf.name == path and buf.persist
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    buf.extend({"x": np.arange(10), "img": np.ones((10, 32, 32), np.uint8)}, lane=0)
    buf.close()  # the creator's close never removes a file
    other = shmbuf.Buffer.attach(path)  # a name with "/" is a path
    assert len(other) == 10 and set(other.sample(200)["x"].tolist()) == set(range(10))
    other.unlink()
    assert not os.path.exists(path) and other.unlinked
    other.close()


def test_relative_paths_and_name_with_a_slash_are_the_same_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with shmbuf.EpisodeBuffer.create({"obs": ((2,), "float32"), "reward": ((), "float32")}, 16,
                                     name="./ep.shmbuf") as ebuf:
        assert ebuf.name == str(tmp_path / "ep.shmbuf")
        again = shmbuf.EpisodeBuffer.attach(str(tmp_path / "ep.shmbuf"))
        assert again.capacity == 16
        again.close()
        ebuf.unlink()


def test_bad_paths_and_both_name_and_path_are_refused(tmp_path):
    with pytest.raises(ValueError, match="name= or path="):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, name="a", path=str(tmp_path / "b"))
    with pytest.raises(ValueError, match="the path of a file"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, path=str(tmp_path) + "/")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, path=str(tmp_path / "no" / "b"))
    assert os.listdir(tmp_path) == []


def test_an_existing_file_is_refused_and_left_as_it_is(path):
    with open(path, "wb") as f:
        f.write(b"precious")
    with pytest.raises(FileExistsError, match="already exists"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, path=path)
    with open(path, "rb") as f:
        assert f.read() == b"precious"


@pytest.mark.parametrize("what", ["missing", "symlink", "fifo", "directory", "empty", "garbage",
                                  "truncated", "not shmbuf"])
def test_attach_refuses_anything_but_a_whole_buffer_file(tmp_path, what):
    p = str(tmp_path / "b.shmbuf")
    error, match = FormatError, None
    if what == "missing":
        error, match = FileNotFoundError, "no buffer file"
    elif what == "symlink":
        with shmbuf.Buffer.create({"x": ((), "int64")}, 4, path=str(tmp_path / "real.shmbuf")):
            pass
        os.symlink(tmp_path / "real.shmbuf", p)
        match = "symbolic link"
    elif what == "fifo":
        os.mkfifo(p)  # opening it must not hang
        match = "not a regular file"
    elif what == "directory":
        os.mkdir(p)
        error = OSError
    elif what == "empty":
        open(p, "w").close()
        match = "empty"
    elif what == "garbage":
        with open(p, "wb") as f:
            f.write(np.random.default_rng(0).bytes(8192))
        match = "bad magic"
    elif what == "truncated":
        with shmbuf.Buffer.create({"x": ((100,), "int64")}, 64, path=p):
            pass
        os.truncate(p, 4096)
        match = "truncated"
    else:
        with open(p, "wb") as f:
            f.write(b"hello world" * 100)
        match = "bad magic"
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(error, match=match):
        shmbuf.Buffer.attach(p, timeout=0.2)
    assert sorted(os.listdir(tmp_path)) == before


MOUNTINFO = textwrap.dedent("""\
    22 1 {dev} / / rw,relatime shared:1 - {fs} server:/export rw
    """)


@pytest.mark.parametrize("fs, refused", [("nfs4", True), ("nfs", True), ("cifs", True), ("smb3", True),
                                         ("fuse.sshfs", True), ("fuseblk", True), ("9p", True),
                                         ("ext4", False), ("xfs", False), ("tmpfs", False)])
def test_network_and_fuse_file_systems_are_refused_with_the_reason(tmp_path, fs, refused):
    st = os.stat(tmp_path)
    info = MOUNTINFO.format(dev=f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", fs=fs)
    assert files.filesystem(str(tmp_path), info) == fs
    if refused:
        with pytest.raises(OSError, match=f"on a {fs} file system.*local disk"):
            files.check_local(str(tmp_path), info)
    else:
        files.check_local(str(tmp_path), info)


def test_the_file_system_of_this_run_is_read_from_mountinfo(tmp_path):
    fs = files.filesystem(str(tmp_path))
    assert fs is None or fs.isidentifier() or "." in fs or fs.isalnum()
    if os.path.exists("/proc/self/mountinfo"):
        assert fs is not None


def test_a_disk_too_small_is_an_error_at_create_and_leaves_nothing(tmp_path):
    free = files.free_bytes(str(tmp_path))
    with pytest.raises(shmbuf.ShmSpaceError, match="not enough disk space") as err:
        shmbuf.Buffer.create({"x": ((1 << 20,), "uint8")}, free // (1 << 20) + 16, path=str(tmp_path / "big"))
    assert err.value.errno == 28
    assert os.listdir(tmp_path) == []


def _create_and_die(path: str) -> None:
    def die(self):
        os.kill(os.getpid(), signal.SIGKILL)
    FileSegment.publish = die  # SIGKILLed when the file is complete, just before it is named
    shmbuf.Buffer.create({"x": ((1000,), "float64")}, 100, path=path)


def test_a_creator_killed_inside_create_leaves_no_file(tmp_path):
    p = mp.get_context("spawn").Process(target=_create_and_die, args=(str(tmp_path / "b.shmbuf"),))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    assert os.listdir(tmp_path) == []  # (an unnamed O_TMPFILE: the kernel freed it)


def test_of_two_creators_of_one_path_the_second_to_finish_fails_and_leaves_nothing(tmp_path):
    p = str(tmp_path / "b.shmbuf")
    first = FileSegment.create(p, 4096)  # complete, not yet named
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, path=p) as buf:
        buf.add({"x": 7})
        with pytest.raises(FileExistsError, match="already exists"):
            first.publish()
        assert first.mmap is None  # closed
        assert shmbuf.Buffer.attach(p).sample(1)["x"].tolist() == [7]
    assert os.listdir(tmp_path) == ["b.shmbuf"]


def _cgroup(limit: int) -> str:
    """A memory cgroup limited to ``limit`` bytes (v2 or v1), or skip."""
    name = f"shmbuf-test-{uuid.uuid4().hex[:8]}"
    for root, knob in (("/sys/fs/cgroup", "memory.max"), ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")):
        if not os.path.exists(os.path.join(root, knob if root.endswith("memory") else "cgroup.subtree_control")):
            continue
        if knob == "memory.max":
            with open(os.path.join(root, "cgroup.subtree_control")) as f:
                if "memory" not in f.read().split():
                    continue
        d = os.path.join(root, name)
        try:
            os.mkdir(d)
        except OSError:
            continue
        try:
            with open(os.path.join(d, knob), "w") as f:
                f.write(str(limit))
            return d
        except OSError:
            os.rmdir(d)
    pytest.skip("no memory cgroup can be made here (needs root and the memory controller)")


FILL_IN_CGROUP = """
    import os, sys
    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))  # from here on, this process's memory is limited
    import numpy as np, shmbuf
    rows = int(sys.argv[3])
    buf = shmbuf.Buffer.create({"img": ((256, 256), "uint8"), "i": ((), "int64")}, rows, path=sys.argv[2])
    for lo in range(0, rows, 64):
        i = np.arange(lo, lo + 64)
        buf.extend({"img": np.broadcast_to((i % 251).astype(np.uint8)[:, None, None], (64, 256, 256)), "i": i})
    seen, bad = set(), 0
    for _ in range(40):
        b = buf.sample(64)
        bad += int((b["img"] != (b["i"] % 251).astype(np.uint8)[:, None, None]).any(axis=(1, 2)).sum())
        seen.update(b["i"].tolist())
    print(len(buf), bad, len(seen) > 1000)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_buffer_four_times_larger_than_the_memory_limit_fills_and_samples(tmp_path):
    limit, rows = 64 << 20, 4096  # 256 MiB of frames in a process limited to 64 MiB
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("under AddressSanitizer a process needs far more than 64 MiB (scripts/test-sanitizers)")
    if files.filesystem(str(tmp_path)) in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is in memory ({files.filesystem(str(tmp_path))}): a file there is not paged to a disk")
    cg = _cgroup(limit)
    try:
        res = subprocess.run([sys.executable, "-c", textwrap.dedent(FILL_IN_CGROUP), cg,
                              str(tmp_path / "big.shmbuf"), str(rows)],
                             capture_output=True, text=True, timeout=580)
        assert res.returncode == 0, (res.returncode, res.stderr[-2000:])  # -9: the OOM killer
        assert res.stdout.split() == [str(rows), "0", "True"]
        assert os.path.getsize(tmp_path / "big.shmbuf") > 4 * limit
    finally:
        os.rmdir(cg)


def test_without_o_tmpfile_a_hidden_name_is_used_and_never_left_behind(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "O_TMPFILE")  # (macOS, or an old kernel)
    p = str(tmp_path / "b.shmbuf")
    first = FileSegment.create(p, 4096)
    assert first.temp_path is not None and os.listdir(tmp_path) == [os.path.basename(first.temp_path)]
    assert stat.S_IMODE(os.stat(first.temp_path).st_mode) == 0o600
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, path=p) as buf:
        buf.add({"x": 1})
        assert sorted(os.listdir(tmp_path)) == sorted(["b.shmbuf", os.path.basename(first.temp_path)])
        with pytest.raises(FileExistsError):
            first.publish()
    assert os.listdir(tmp_path) == ["b.shmbuf"]  # the loser's hidden file is gone


def test_without_o_tmpfile_a_create_that_fails_after_the_file_is_made_leaves_nothing(tmp_path, monkeypatch):
    """Trust round 3, item 14: an exception inside Buffer.create, after the hidden file
    exists and before it is published, removes it."""
    from shmbuf.core import layout as layout_mod
    monkeypatch.delattr(os, "O_TMPFILE")

    def fail(self, mem):
        raise RuntimeError("fails on purpose while the header is written")
    monkeypatch.setattr(layout_mod.Layout, "write", fail)
    with pytest.raises(RuntimeError, match="on purpose"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, path=str(tmp_path / "b.shmbuf"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("where", ["/proc/shmbuf-test.shmbuf", "/sys/shmbuf-test.shmbuf"])
def test_a_path_on_a_file_system_the_kernel_makes_up_is_refused_saying_so(where):
    if files.filesystem(os.path.dirname(where)) not in files.PSEUDO:
        pytest.skip(f"{os.path.dirname(where)} is not a pseudo file system here")
    with pytest.raises(OSError, match="file system, which the kernel makes up"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, path=where)
    assert not os.path.exists(where)


def _rm_as_nobody(paths: list, results) -> None:
    """(A forked child) drop to user nobody, run ``shmbuf rm`` on ``paths``; put its stderr."""
    import contextlib
    import io
    from shmbuf import cli
    os.setgid(65534)
    os.setuid(65534)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["rm", *paths])
    results.put((code, err.getvalue()))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run a child as another user")
def test_rm_of_another_users_buffer_file_says_permission_denied(tmp_path):
    """Trust round 3, item 14: never "not a shmbuf buffer file" nor "no such file" when
    the truth is that this user may not read it (a closed file, or a closed directory)."""
    import tempfile
    opened = tempfile.mkdtemp(prefix="shmbuf-test-rm-")  # readable by all; the file in it is not
    try:
        os.chmod(opened, 0o755)
        paths = [os.path.join(opened, "b.shmbuf"), str(tmp_path / "c.shmbuf")]  # tmp_path: 0700
        for p in paths:
            shmbuf.Buffer.create({"x": ((), "int64")}, 4, path=p).close()
        ctx = mp.get_context("fork")
        results = ctx.Queue()
        child = ctx.Process(target=_rm_as_nobody, args=(paths, results))
        child.start()
        code, err = results.get(timeout=60)
        child.join(30)
        assert code == 1 and err.count("permission denied: this user may not read or remove it") == 2, err
        assert all(os.path.exists(p) for p in paths)
    finally:
        for p in os.listdir(opened):
            os.unlink(os.path.join(opened, p))
        os.rmdir(opened)


@pytest.fixture
def btrfs(tmp_path):
    """A small btrfs file system of this test's own (an image in tmp_path, loop-mounted
    there): needs root and btrfs-progs (CI installs them); skipped elsewhere."""
    import shutil
    if os.geteuid() != 0 or shutil.which("mkfs.btrfs") is None:
        pytest.skip("needs root and mkfs.btrfs (btrfs-progs) to make a btrfs file system")
    image, mnt = tmp_path / "btrfs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(160 << 20)
    made = subprocess.run(["mkfs.btrfs", "-q", str(image)], capture_output=True)
    mounted = made.returncode == 0 and subprocess.run(["mount", "-o", "loop", str(image), str(mnt)],
                                                      capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("could not make and loop-mount a btrfs file system here")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


FILL_THE_DISK = textwrap.dedent("""
    import os, sys, numpy as np, shmbuf
    d = sys.argv[1]
    buf = shmbuf.Buffer.create({"x": ((4096,), "uint8")}, 4000, path=os.path.join(d, "b.shmbuf"))
    with open(os.path.join(d, "filler"), "wb") as f:  # the disk fills up after the create
        try:
            while True:
                f.write(bytes(1 << 20)); f.flush(); os.fsync(f.fileno())
        except OSError:
            pass
    for i in range(3):  # every slot rewritten, three times
        buf.extend({"x": np.full((4000, 4096), i, np.uint8)})
        buf.flush()
    print(len(buf), int(buf.sample(64)["x"].min()))
""")


@pytest.mark.slow
@pytest.mark.timeout(600)  # (disk-bound: 85-95 s on a loaded machine, 2.5 s of it CPU)
def test_a_buffer_file_on_btrfs_is_no_cow_and_a_full_disk_never_kills_its_writer(btrfs):
    """Trust round 3, item 8: on btrfs a rewrite needs new blocks (copy-on-write), which
    the reservation at create does not cover: once the disk was full, writes through the
    mapping died with SIGBUS. The file is made no-COW, and all rewrites go in."""
    res = subprocess.run([sys.executable, "-c", FILL_THE_DISK, btrfs], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.split() == ["4000", "2"], (res.returncode, res.stdout, res.stderr[-2000:])
    flags = subprocess.run(["lsattr", os.path.join(btrfs, "b.shmbuf")], capture_output=True, text=True).stdout
    assert "C" in flags.split()[0]


def test_a_copy_on_write_buffer_file_on_btrfs_is_refused_at_attach(btrfs):
    p = os.path.join(btrfs, "b.shmbuf")
    shmbuf.Buffer.create({"x": ((), "int64")}, 8, path=p).close()
    with open(p, "rb") as src, open(p + ".copy", "wb") as dst:  # a plain copy: copy-on-write again
        dst.write(src.read())
    os.chmod(p + ".copy", 0o600)
    with pytest.raises(OSError, match="is on btrfs and copy-on-write"):
        shmbuf.Buffer.attach(p + ".copy")
    with shmbuf.Buffer.attach(p) as b:  # (the original is fine)
        b.add({"x": 1})
