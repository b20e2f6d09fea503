"""The files of a save on disk: ``.npy`` arrays written and read in chunks, owner-only
permissions, a progress bar, and the temporaries a save leaves while it runs
(``.NAME.shmbuf-tmp-PID-START-XXXXXXXX``): found and removed once their process is gone.
See :mod:`shmbuf.persist.save` for the format."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from numpy.lib import format as npformat

from shmbuf.core import procs

META_FILE = "shmbuf.json"


class Progress:
    """A one-line progress bar on stderr, drawn only on a terminal (``show=None``) or
    when asked; at most ten redraws a second."""

    def __init__(self, what: str, total: int, show: bool | None) -> None:
        self.what, self.total, self.done, self.last = what, max(total, 1), 0, 0.0
        self.show = sys.stderr.isatty() if show is None else bool(show)

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if self.show and now - self.last >= 0.1:
            self.last = now
            self._draw()

    def _draw(self) -> None:
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(30 * frac)
        print(f"\r{self.what} [{bar:<30}] {100 * frac:5.1f}% of {self.total / 2**20:,.1f} MiB",
              end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.show:
            self.done = self.total
            self._draw()
            print(file=sys.stderr, flush=True)


# -- save ---------------------------------------------------------------------------


class NpyOut:
    """A ``.npy`` file written front to back: its header, then rows in order, by slice
    assignment (``out[lo:hi] = rows``, as :func:`shmbuf.core.contents.copy_rows` does). Plain
    ``write`` calls: no memory-mapped pages of a new file to fault in one by one."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.f = private_file(path)
        self.dtype, self.next = np.dtype(dtype), 0
        npformat.write_array_header_2_0(
            self.f, {"descr": npformat.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape})

    def __setitem__(self, rows: slice, value: np.ndarray) -> None:
        if rows.start != self.next:
            raise AssertionError("rows must be written in order")
        a = np.ascontiguousarray(value, self.dtype).reshape(-1)
        self.f.write(a.view(np.uint8).data)
        self.next = rows.stop



class NpyIn:
    """Rows of a checked ``.npy`` file (``mapped``: its read-only memory map) read with
    plain ``readinto`` calls into the destination (no page faults on a file mapping)."""

    def __init__(self, path: Path, mapped: np.memmap) -> None:
        self.f = open(path, "rb", buffering=0)
        self.start = mapped.offset
        self.row_bytes = mapped.itemsize * int(np.prod(mapped.shape[1:], dtype=np.int64))
        self.dtype = mapped.dtype

    def copy_to(self, lo: int, dest: np.ndarray) -> None:
        direct = dest.flags.c_contiguous
        buf = dest if direct else np.empty(dest.shape, self.dtype)
        view = memoryview(buf.reshape(-1).view(np.uint8))
        self.f.seek(self.start + lo * self.row_bytes)
        done = 0
        while done < len(view):
            n = self.f.readinto(view[done:])
            if not n:
                raise ValueError(f"{self.f.name!r} was truncated while it was being loaded")
            done += n
        if not direct:
            dest[...] = buf

    def close(self) -> None:
        self.f.close()


class Mapped(dict):
    """The fields a save wrote so far (``{field: file name}`` in ``tmp``), each
    memory-mapped from its file when asked for (the records' reader asks for the record
    words only)."""

    def __init__(self, tmp: Path, files: dict[str, str]) -> None:
        super().__init__()
        self.tmp, self.files = tmp, files

    def __missing__(self, name: str) -> np.ndarray:
        a = self[name] = np.load(self.tmp / self.files[name], mmap_mode="r", allow_pickle=False)
        return a


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_SAVE_FILE = re.compile(r"(shmbuf\.json|stamps\.npy|priority\.npy|field-[0-9]{3,}\.npy"
                        r"|ragged-[0-9]{3,}-(?:values|offsets)\.npy)")
_TEMPORARY = re.compile(r"\..+\.shmbuf-(?:tmp|old)-([0-9]+)-(?:([0-9]+\.[0-9]{3})-)?[0-9a-f]{8}")


def private_file(path: Path) -> Any:
    """A new file at ``path`` (an error if one exists), open for binary writing, readable
    by its owner alone (0600, whatever the umask): a save holds every row of a buffer
    whose segment only its owner may read."""
    return open(path, "xb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW, 0o600))


def check_destination(dest: Path, overwrite: bool) -> None:
    """Raise ``FileExistsError`` unless ``dest`` may become a save: nothing there, or
    (with ``overwrite``) a directory holding a save and nothing else."""
    if dest.is_symlink():
        raise FileExistsError(f"{str(dest)!r} is a symbolic link (to {os.readlink(dest)!r}); a save "
                              "never writes through one nor replaces it: save to the path it points to, "
                              "or remove the link first")
    if not dest.exists():
        return
    if not overwrite:
        raise FileExistsError(f"{str(dest)!r} exists; pass overwrite=True to replace it, or "
                              "choose another path")
    if not dest.is_dir() or not (dest / META_FILE).is_file():
        raise FileExistsError(f"{str(dest)!r} exists and is not a shmbuf save; refusing to "
                              "replace it")
    other = sorted(f.name for f in dest.iterdir() if not _is_save_file(f))
    if other:
        raise FileExistsError(f"{str(dest)!r} holds files that are not part of a shmbuf save "
                              f"({', '.join(other[:5])}{', ...' if len(other) > 5 else ''}); "
                              "refusing to replace it, which would delete them")


def _is_save_file(f: Path) -> bool:
    """A regular file (not a link) named as the save format names its files."""
    return bool(_SAVE_FILE.fullmatch(f.name)) and f.is_file() and not f.is_symlink()


def remove_tree(directory: Path) -> None:
    """Remove a save directory (this module's own temporary or replaced one): its save
    files, then itself if that emptied it. Nothing else is ever deleted."""
    if directory.is_symlink() or not directory.is_dir():
        return
    for f in directory.iterdir():
        if _is_save_file(f):
            f.unlink()
    try:
        directory.rmdir()
    except OSError:
        pass  # something else is in it: left alone


def temporaries(parent: str | os.PathLike) -> list[Path]:
    """The temporary directories in ``parent`` of saves whose process is dead (killed
    mid-save): ``.NAME.shmbuf-tmp-*`` (a save being written) and ``.NAME.shmbuf-old-*``
    (a save being replaced)."""
    found = []
    try:
        entries = list(Path(os.fspath(parent)).iterdir())
    except OSError:
        return []
    for entry in entries:
        m = _TEMPORARY.fullmatch(entry.name)
        if m is None or entry.is_symlink() or not entry.is_dir():
            continue
        pid = int(m.group(1))
        alive = (procs.is_alive(pid, float(m.group(2))) if m.group(2) is not None
                 else psutil.pid_exists(pid))  # (the names of shmbuf 0.1.0: a pid alone)
        if not alive:
            found.append(entry)
    return found


def clear_temporaries(parent: str | os.PathLike) -> list[Path]:
    """Remove what :func:`temporaries` finds (their save files only); returns them."""
    found = temporaries(parent)
    clear_temporaries_in(found)
    return found


def clear_temporaries_in(found: list[Path]) -> None:
    """Remove these temporaries of :func:`temporaries` (their save files only)."""
    for d in found:
        remove_tree(d)


# -- load ---------------------------------------------------------------------------
