"""Creating, attaching and destroying segments; what attach does with bad segments."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest

import shmbuf
from helpers import patch_schema_doc
from shmbuf.core import layout, segment
from shmbuf.core import counters as stats

from conftest import MUJOCO, shm_path


def test_create_attach_unlink(name):
    buf = shmbuf.Buffer.create(MUJOCO, 100, name=name)
    assert os.path.exists(shm_path(name))
    other = shmbuf.Buffer.attach(name)
    assert other.fields == buf.fields and other.capacity == 100 and other.name == name
    other.close()
    assert os.path.exists(shm_path(name)), "an attached handle's close destroyed it"
    buf.close()
    assert not os.path.exists(shm_path(name))
    with pytest.raises(FileNotFoundError, match="no shared-memory buffer named"):
        shmbuf.Buffer.attach(name)


def test_unlink_twice_is_harmless_and_handles_keep_working(name):
    buf = shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name)
    other = shmbuf.Buffer.attach(name)
    other.unlink()
    other.unlink()
    assert not os.path.exists(shm_path(name))
    buf.add({"x": 3})  # still mapped: keeps working
    assert other.sample(1)["x"][0] == 3
    other.close()
    buf.close()  # the creator's close after someone else's unlink: no error


def test_name_taken(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name):
        with pytest.raises(FileExistsError, match="already exists"):
            shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name)


@pytest.mark.parametrize("bad", ["", "a:b", "-x", "x" * 300, 5, "a b"])  # ("a/b" is a file path)
def test_bad_names(bad):
    with pytest.raises(ValueError, match="invalid buffer name"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=bad)


def test_creator_close_does_not_destroy_a_recreated_name(name):
    first = shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name)
    first.unlink()
    second = shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name)
    first.close()
    assert shmbuf.Buffer.attach(name).capacity == 8, "closing the old owner removed the new buffer"
    second.close()


def _raw_segment(name: str, data: bytes) -> None:
    seg = segment.Segment.create(name, max(len(data), 1))
    seg.mmap[:len(data)] = data
    seg.untrack()  # the test unlinks it
    seg.close()


def assert_rejected(name: str, data: bytes, match: str, **attach_kwargs) -> None:
    """A segment holding ``data`` is refused by attach with a FormatError matching ``match``."""
    _raw_segment(name, data)
    try:
        with pytest.raises(shmbuf.FormatError, match=match):
            shmbuf.Buffer.attach(name, **attach_kwargs)
    finally:
        segment.unlink_name(name)


def real_header(patch) -> bytes:
    """The bytes of a real buffer's segment, changed by ``patch(bytearray)``."""
    with shmbuf.Buffer.create({"x": ((4,), "int64")}, 64) as buf:
        raw = bytearray(buf.engine.seg.mmap[:buf.engine.layout.total_size])
    patch(raw)
    return bytes(raw)


def patch_schema(raw: bytearray, edit) -> None:
    """Rewrite the field list of a segment image's schema with ``edit(list_of_field_dicts)``."""
    patch_schema_doc(raw, lambda doc: edit(doc["fields"]))


def test_attach_rejects_foreign_segment(name):
    assert_rejected(name, b"hello world" * 100, "bad magic")


def test_attach_rejects_tiny_segment(name):
    assert_rejected(name, b"x", "smaller than a header")


def test_attach_rejects_unknown_version(name):
    assert_rejected(name, real_header(lambda raw: struct.pack_into("<I", raw, 8, 99)),
                    "format version 99")


def test_attach_rejects_truncated_segment(name):
    def cut(raw):
        del raw[len(raw) // 2:]
    assert_rejected(name, real_header(cut), "truncated")


def test_attach_rejects_lying_offsets(name):
    # a field offset pointing past the end must be caught before anything is read
    def lie(raw):
        patch_schema(raw, lambda fields: fields[0].update(offset=64 * 10**6))
    assert_rejected(name, real_header(lie), "outside the segment|does not fit in the rows block")


def test_attach_waits_for_a_header_being_written_then_gives_up(name):
    assert_rejected(name, b"\0" * 4096, "did not become a complete buffer within 0.2 s", timeout=0.2)


def test_too_big_for_dev_shm_fails_at_creation(name):
    free = segment.free_bytes()
    capacity = free // 64 + 1_000_000  # rows of 64 bytes: more than /dev/shm has
    with pytest.raises(shmbuf.ShmSpaceError) as info:
        shmbuf.Buffer.create({"x": ((8,), "float64")}, capacity, name=name)
    msg = str(info.value)
    assert "needs" in msg and "free" in msg and "--shm-size" in msg
    needed = layout.Layout.plan({"x": ((8,), "float64")}, capacity, meta={layout.USER: {}},
                                regions={stats.REGION: stats.region_bytes(1)}).total_size
    assert f"needs {needed:,} bytes" in msg
    assert f"{segment.free_bytes():,}"[:4] in msg  # states what is available
    assert not os.path.exists(shm_path(name))


def test_fallocate_failure_is_reported_not_sigbus(name, monkeypatch):
    """Pretend /dev/shm is huge so the pre-check passes: fallocate must still fail cleanly."""
    monkeypatch.setattr(segment, "free_bytes", lambda path=segment.SHM_DIR: 1 << 62)
    too_big = os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize * 2
    with pytest.raises(shmbuf.ShmSpaceError, match="--shm-size"):
        segment.Segment.create(name, too_big)
    assert not os.path.exists(shm_path(name))


SMALL_SHM = textwrap.dedent("""
    import os, numpy as np, shmbuf
    from shmbuf.core import segment
    assert segment.free_bytes() <= 2 << 20, segment.free_bytes()
    try:
        shmbuf.Buffer.create({"x": ((1024,), "float64")}, 1000, name="small")  # 8 MB
    except shmbuf.ShmSpaceError as exc:
        print("PRECHECK", exc)
    segment.free_bytes = lambda path=None: 1 << 40   # skip the pre-check: fallocate must catch it
    try:
        shmbuf.Buffer.create({"x": ((1024,), "float64")}, 1000, name="small")
    except shmbuf.ShmSpaceError as exc:
        print("FALLOCATE", exc)
    with shmbuf.Buffer.create({"x": ((1024,), "float64")}, 100, name="fits") as b:  # 800 kB
        b.extend({"x": np.ones((100, 1024))})
        print("FITS", len(b))
    print("LEFT", os.listdir("/dev/shm"))
""")


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare(1)")
def test_real_small_dev_shm():
    """A real 2 MB /dev/shm in a private mount namespace, like docker's --shm-size."""
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           f"mount -t tmpfs -o size=2m tmpfs /dev/shm && exec {sys.executable} -c '{SMALL_SHM}'"]
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.decode().strip()}")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "PRECHECK not enough shared memory" in res.stdout
    assert "FALLOCATE not enough shared memory" in res.stdout
    assert "FITS 100" in res.stdout
    assert "LEFT []" in res.stdout
    assert res.stderr == ""
