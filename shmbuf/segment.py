"""One named POSIX shared-memory segment: create, attach, unlink, and sizing.

This is the bottom layer. It knows nothing about buffers; it maps bytes.

It uses the same primitive as :class:`multiprocessing.shared_memory.SharedMemory`
(``_posixshmem.shm_open``) but differs in three ways that matter for a buffer
shared by unrelated processes:

* **Attaching never registers with the resource tracker** (on every Python version).
  ``SharedMemory`` before 3.13 registers on attach, so an attaching process that
  exits destroys the segment (cpython#82300). Only a creator that asks for it
  (``track=True``) registers, so a crashed creator's segment is still cleaned up.
* **Memory is reserved at creation.** The free space of ``/dev/shm`` is checked
  first, then ``posix_fallocate`` reserves every page, so a segment that does not fit
  fails here with a clear error instead of killing a later writer with SIGBUS
  (cpython#114390).
* The file descriptor is closed once mapped: the mapping keeps the memory alive.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import sys
from multiprocessing import resource_tracker

try:
    import _posixshmem
except ImportError as exc:  # pragma: no cover - Windows
    raise ImportError("shmbuf needs POSIX shared memory (Linux or macOS)") from exc

PREFIX = "shmbuf-"
"""Every segment's OS name is ``PREFIX + name``, so ``shmbuf ls`` can find them."""

SHM_DIR = "/dev/shm"
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# macOS allows 31 bytes with the leading slash; Linux allows NAME_MAX (255).
MAX_NAME_LEN = (30 - len(PREFIX)) if sys.platform == "darwin" else 200


class ShmSpaceError(OSError):
    """``/dev/shm`` has less free space than the segment needs (``errno`` is ENOSPC)."""

    def __str__(self) -> str:
        return str(self.strerror)


def os_name(name: str) -> str:
    """The POSIX shared-memory name (with leading slash) of a buffer name."""
    return "/" + PREFIX + name


def check_name(name: object) -> str:
    """Return ``name`` if it is a valid buffer name, else raise ``ValueError``."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME_LEN:
        raise ValueError(
            f"invalid buffer name {name!r}: expected 1 to {MAX_NAME_LEN} characters of "
            "letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return name


def free_bytes(path: str = SHM_DIR) -> int | None:
    """Bytes an unprivileged process may still allocate under ``path`` (None if unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _space_error(needed: int, available: int | None) -> ShmSpaceError:
    avail = "unknown" if available is None else f"{available:,}"
    return ShmSpaceError(
        errno.ENOSPC,
        f"not enough shared memory for this buffer: it needs {needed:,} bytes and "
        f"{SHM_DIR} has {avail} bytes free. Use a smaller capacity, free space in "
        f"{SHM_DIR} (see `shmbuf ls`), or, in a container, give it more with "
        "`docker run --shm-size=<size>` (or `--ipc=host`).",
    )


class Segment:
    """A mapped shared-memory segment. Use :meth:`create` or :meth:`attach`.

    Example:
        >>> seg = Segment.create("doc-seg", 4096)
        >>> seg.mmap[0] = 7
        >>> Segment.attach("doc-seg").mmap[0]
        7
        >>> seg.unlink()
        True
        >>> seg.close()
    """

    def __init__(self, name: str, mapping: mmap.mmap, tracked: bool) -> None:
        self.name = name
        self.mmap: mmap.mmap | None = mapping
        self.size = len(mapping)  # page-rounded by the OS: the header holds the logical size
        self._tracked = tracked

    @classmethod
    def create(cls, name: str, size: int, *, track: bool = True) -> "Segment":
        """Create a new segment of ``size`` bytes, every page reserved.

        Raises ``FileExistsError`` if the name is taken and :class:`ShmSpaceError`
        if ``/dev/shm`` cannot hold it. With ``track=True`` the segment is registered
        with this process tree's resource tracker, which destroys it if every process
        of the tree dies without unlinking it.
        """
        check_name(name)
        if size <= 0:
            raise ValueError(f"segment size must be positive, got {size}")
        available = free_bytes()
        if available is not None and size > available:
            raise _space_error(size, available)
        path = os_name(name)
        try:
            fd = _posixshmem.shm_open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        except FileExistsError:
            raise FileExistsError(
                errno.EEXIST,
                f"a shared-memory buffer named {name!r} already exists: attach to it with "
                f"Buffer.attach({name!r}), pick another name, or remove it with "
                f"`shmbuf rm {name}`",
            ) from None
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
                        raise _space_error(size, free_bytes()) from None
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            _posixshmem.shm_unlink(path)
            raise
        os.close(fd)
        if track:
            resource_tracker.register(path, "shared_memory")
        return cls(name, mapping, tracked=track)

    @classmethod
    def attach(cls, name: str) -> "Segment":
        """Map an existing segment. Never registers with the resource tracker."""
        check_name(name)
        try:
            fd = _posixshmem.shm_open(os_name(name), os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            raise FileNotFoundError(
                errno.ENOENT,
                f"no shared-memory buffer named {name!r} exists (it was never created, "
                "or it was destroyed: by its creator's close(), by unlink(), or because "
                "its creator exited without persist=True). `shmbuf ls` lists buffers",
            ) from None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise ValueError(f"shared-memory segment {name!r} is empty: not a shmbuf buffer")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, mapping, tracked=False)

    def populate(self, ranges: list[tuple[int, int]]) -> bool:
        """Map the pages of the byte ``ranges`` into this process now, so that first
        touches later do not page-fault one by one (a 3x speed-up for fresh writers of
        large rows). Linux 5.14+ (MADV_POPULATE_WRITE); returns False where unsupported."""
        if self.mmap is None or sys.platform != "linux":
            return False
        page = mmap.PAGESIZE
        try:
            for start, length in ranges:
                lo = start - start % page
                hi = min(self.size, -(-(start + length) // page) * page)
                if hi > lo:
                    self.mmap.madvise(_MADV_POPULATE_WRITE, lo, hi - lo)
        except OSError:  # an older kernel: pages will be faulted in on first touch
            return False
        return True

    def unlink(self) -> bool:
        """Remove the name, so nobody can attach again. Returns False if already gone.

        Processes that have it mapped keep working; the memory is freed when the last
        one closes it.
        """
        gone = unlink_name(self.name)
        if self._tracked:
            resource_tracker.unregister(os_name(self.name), "shared_memory")
            self._tracked = False
        return gone

    def close(self) -> None:
        """Unmap. Arrays still viewing the memory keep it mapped until they are freed."""
        if self.mmap is None:
            return
        try:
            self.mmap.close()
        except BufferError:
            pass  # numpy views are still alive; the mapping goes when they do
        self.mmap = None


def unlink_name(name: str) -> bool:
    """Remove a segment by name; False if it did not exist."""
    try:
        _posixshmem.shm_unlink(os_name(name))
    except FileNotFoundError:
        return False
    return True


def open_fd(name: str) -> int:
    """A fresh descriptor (own open file description) on the segment, close-on-exec."""
    return _posixshmem.shm_open(os_name(name), os.O_RDWR, mode=0o600)


def list_names() -> list[str]:
    """Names of the shmbuf segments visible in ``/dev/shm`` (Linux)."""
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted(e[len(PREFIX):] for e in entries if e.startswith(PREFIX))
