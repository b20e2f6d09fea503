"""One named POSIX shared-memory segment: create, attach, unlink, and sizing.

This is the bottom layer. It knows nothing about buffers; it maps bytes.

It uses the same primitive as :class:`multiprocessing.shared_memory.SharedMemory`
(``_posixshmem.shm_open``) but differs where it matters for a buffer shared by
unrelated processes:

* **Attaching never registers with the resource tracker** (on every Python version).
  ``SharedMemory`` before 3.13 registers on attach, so an attaching process that
  exits destroys the segment (cpython#82300).
* **A creator registers at once**, right after ``shm_open``, before it sizes or fills
  the segment: a creator killed half-way through ``create`` leaves nothing behind. A
  persistent buffer drops the registration once it is complete (:meth:`Segment.untrack`).
* **Memory is reserved at creation.** The free space of ``/dev/shm`` is checked
  first, then every page is allocated (``posix_fallocate``, or writing zeros where the
  filesystem lacks it), so a segment that does not fit fails here with a clear error
  instead of killing a later writer with SIGBUS (cpython#114390). ``attach`` checks
  that every page of the segment it found is allocated (:meth:`Segment.ensure_allocated`).
* **One descriptor per handle, kept open.** It identifies the segment (its inode) for
  as long as the handle lives, so a name removed and re-created by someone else is
  never confused with it, and it is the descriptor the header lock uses. After a fork
  the child reopens it as a new open file description of the *same* inode.

**Namespaces.** Every segment's OS name is ``shmbuf-<name>``; with the environment
variable ``SHMBUF_NAMESPACE=ns`` it is ``shmbuf@ns-<name>``. Processes in different
namespaces never see each other's buffers (``shmbuf ls`` lists its own namespace),
which keeps, for example, parallel test runs on one machine apart.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import sys
import weakref
from multiprocessing import resource_tracker

try:
    import _posixshmem
except ImportError as exc:  # pragma: no cover - Windows
    raise ImportError("shmbuf needs POSIX shared memory (Linux or macOS)") from exc

PREFIX = "shmbuf-"
"""OS names of the default namespace are ``PREFIX + name``."""

NAMESPACE_ENV = "SHMBUF_NAMESPACE"
SHM_DIR = "/dev/shm"
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# macOS allows 31 bytes with the leading slash; Linux allows NAME_MAX (255).
MAX_NAME_LEN = (30 - len(PREFIX)) if sys.platform == "darwin" else 200
_ZEROS = bytes(1 << 20)


class FormatError(ValueError):
    """The segment exists but is not a (compatible, complete, usable) shmbuf buffer."""


class NotReadyError(FormatError):
    """The segment exists but its creator has not finished making it (or died doing so)."""


class ShmSpaceError(OSError):
    """``/dev/shm`` has less free space than the segment needs (``errno`` is ENOSPC)."""

    def __str__(self) -> str:
        return str(self.strerror)


def prefix() -> str:
    """The OS-name prefix of this process's namespace (see the module docstring)."""
    ns = os.environ.get(NAMESPACE_ENV, "")
    if not ns:
        return PREFIX
    if not _NAME_RE.fullmatch(ns) or len(ns) > 40:
        raise ValueError(f"{NAMESPACE_ENV}={ns!r} is not a valid namespace: expected 1 to 40 "
                         "letters, digits, '_', '.' or '-', starting with a letter or digit")
    return f"shmbuf@{ns}-"


def os_name(name: str) -> str:
    """The POSIX shared-memory name (with leading slash) of a buffer name."""
    return "/" + prefix() + name


def check_name(name: object) -> str:
    """Return ``name`` if it is a valid buffer name, else raise ``ValueError``."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or len(name) > MAX_NAME_LEN:
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


def check_space(size: int) -> None:
    """Raise :class:`ShmSpaceError` if ``/dev/shm`` cannot hold a segment of ``size``
    bytes now (nothing is allocated)."""
    available = free_bytes()
    if available is not None and size > available:
        raise _space_error(size, available)


def allocate(fd: int, size: int) -> None:
    """Give every page of the file memory now (ENOSPC here, not SIGBUS later)."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except AttributeError:  # pragma: no cover - macOS: no posix_fallocate
        pass
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
            raise _space_error(size, free_bytes()) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
    # No fallocate on this filesystem: writing zeros allocates the pages the same way,
    # and a full filesystem answers write() with ENOSPC (a store into the mapping would
    # get SIGBUS instead).
    try:
        for pos in range(0, size, len(_ZEROS)):
            os.pwrite(fd, _ZEROS[:min(len(_ZEROS), size - pos)], pos)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
            raise _space_error(size, free_bytes()) from None
        raise


def _not_found(name: str) -> FileNotFoundError:
    return FileNotFoundError(
        errno.ENOENT,
        f"no shared-memory buffer named {name!r} exists (it was never created, "
        "or it was destroyed: by its creator's close(), by unlink(), or because "
        "its creator exited without persist=True). `shmbuf ls` lists buffers",
    )


_live: "weakref.WeakSet[Segment]" = weakref.WeakSet()


class Segment:
    """A mapped shared-memory segment and this handle's own descriptor on it.

    Use :meth:`create` or :meth:`attach`.

    Examples:
        >>> seg = Segment.create("doc-seg", 4096)
        >>> seg.mmap[0] = 7
        >>> other = Segment.attach("doc-seg"); other.mmap[0]
        7
        >>> seg.unlink(), other.is_linked()
        (True, False)
        >>> other.close(); seg.close()
    """

    def __init__(self, name: str, os_path: str, fd: int, mapping: mmap.mmap,
                 tracked: bool) -> None:
        self.name = name
        self.fd = fd
        self.mmap: mmap.mmap | None = mapping
        self.size = len(mapping)
        st = os.fstat(fd)
        self.dev, self.ino = st.st_dev, st.st_ino  # identify this segment, whatever its name does
        self._os_path = os_path  # fixed at open: the namespace may not change under us
        self._tracked = tracked
        _live.add(self)

    @classmethod
    def create(cls, name: str, size: int) -> "Segment":
        """Create a new segment of ``size`` bytes, every page allocated.

        The segment is registered with this process tree's resource tracker before
        anything else happens, so it is destroyed if every process of the tree dies
        without unlinking it; :meth:`untrack` drops that for a segment meant to outlive
        its creator. Raises ``FileExistsError`` if the name is taken and
        :class:`ShmSpaceError` if ``/dev/shm`` cannot hold it (nothing is left behind).
        """
        check_name(name)
        if size <= 0:
            raise ValueError(f"segment size must be positive, got {size}")
        check_space(size)
        path = os_name(name)
        resource_tracker.ensure_running()  # so that registering below is one pipe write
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
            resource_tracker.register(path, "shared_memory")
            os.ftruncate(fd, size)
            allocate(fd, size)
            mapping = mmap.mmap(fd, size)
            return cls(name, path, fd, mapping, tracked=True)
        except BaseException:
            os.close(fd)
            _posixshmem.shm_unlink(path)
            resource_tracker.unregister(path, "shared_memory")
            raise

    @classmethod
    def attach(cls, name: str) -> "Segment":
        """Map an existing segment. Never registers with the resource tracker.

        Raises ``FileNotFoundError`` for a missing name and :class:`NotReadyError` for a
        segment whose creator has not sized it yet.
        """
        check_name(name)
        path = os_name(name)
        try:
            fd = _posixshmem.shm_open(path, os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            raise _not_found(name) from None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise NotReadyError(f"shared-memory segment {name!r} is empty: it is still being "
                                    "created, or its creator died while creating it")
            return cls(name, path, fd, mmap.mmap(fd, size), tracked=False)
        except BaseException:
            os.close(fd)
            raise

    durable = False
    """True for a segment in a file (:mod:`shmbuf.core.files`), which outlives a restart."""
    kind = "shm"  # (see shmbuf.core.storage)
    check_name = staticmethod(check_name)

    @staticmethod
    def check_space(size: int) -> None:
        """Raise :class:`ShmSpaceError` if ``/dev/shm`` cannot hold ``size`` more bytes."""
        check_space(size)

    def publish(self) -> None:
        """Make a complete new segment visible (a named segment already is)."""

    def sync(self, start: int = 0, stop: int | None = None) -> None:
        """Write the memory to its file; nothing to do for shared memory."""

    def ensure_allocated(self) -> None:
        """Make sure every page has memory behind it, or raise :class:`FormatError`.

        A sparse segment (sized with ``ftruncate`` only) maps fine, but the first store
        into a page that ``/dev/shm`` cannot back kills the process with SIGBUS.
        """
        st = os.fstat(self.fd)
        if st.st_blocks * 512 >= st.st_size:
            return
        try:  # fallocate keeps the contents; never write zeros over a live buffer
            os.posix_fallocate(self.fd, 0, st.st_size)
            return
        except (AttributeError, OSError) as exc:
            why = str(exc)
        raise FormatError(
            f"shared-memory segment {self.name!r} is sparse: only {st.st_blocks * 512:,} of its "
            f"{st.st_size:,} bytes have memory behind them, and allocating the rest failed "
            f"({why}). Writing to it could crash with SIGBUS. Free space in /dev/shm, or remove "
            "it (`shmbuf rm`) and create it again with shmbuf")

    def is_linked(self) -> bool:
        """True while this segment's name still refers to this very segment."""
        try:
            fd = _posixshmem.shm_open(self._os_path, os.O_RDONLY, mode=0o600)
        except OSError:
            return False
        try:
            return os.fstat(fd).st_ino == self.ino
        finally:
            os.close(fd)

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

    def untrack(self) -> None:
        """Drop this process's resource-tracker entry: the segment then outlives it."""
        if self._tracked:
            resource_tracker.unregister(self._os_path, "shared_memory")
            self._tracked = False

    def unlink(self) -> bool:
        """Remove the name if it still refers to this segment, so nobody can attach
        again; False if it was already gone (or now names another segment, which is
        left alone). Drops the resource-tracker entry either way.

        Processes that have it mapped keep working; the memory is freed when the last
        one closes it.
        """
        gone = False
        if self.is_linked():
            try:
                _posixshmem.shm_unlink(self._os_path)
                gone = True
            except FileNotFoundError:
                pass
        self.untrack()
        return gone

    def close(self) -> None:
        """Close the descriptor and unmap. Arrays still viewing the memory keep it mapped
        until they are freed."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        _live.discard(self)
        if self.mmap is None:
            return
        try:
            self.mmap.close()
        except BufferError:
            pass  # numpy views are still alive; the mapping goes when they do
        self.mmap = None

    def after_fork_in_child(self) -> None:
        """Replace the inherited descriptor (an open file description shared with the
        parent, and with it any flock on it) by a new one on the same segment."""
        self._tracked = False  # the parent's registration; a forked copy never owns it
        if self.fd < 0:
            return
        old, self.fd = self.fd, -1
        try:
            fd = os.open(f"/proc/self/fd/{old}", os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # no /proc: reopen by name, only if it is still the same segment
            fd = self._reopen_by_name()
        os.close(old)
        self.fd = fd

    def _open_name(self) -> int:
        """A new descriptor on whatever the name refers to now (OSError if nothing)."""
        return _posixshmem.shm_open(self._os_path, os.O_RDWR, mode=0o600)

    def _reopen_by_name(self) -> int:
        try:
            fd = self._open_name()
        except OSError:
            return -1
        if os.fstat(fd).st_ino != self.ino:
            os.close(fd)
            return -1
        return fd


def _reopen_all_in_child() -> None:
    for seg in list(_live):
        seg.after_fork_in_child()


os.register_at_fork(after_in_child=_reopen_all_in_child)


def unlink_name(name: str) -> bool:
    """Remove a segment by name; False if it did not exist."""
    try:
        _posixshmem.shm_unlink(os_name(check_name(name)))
    except FileNotFoundError:
        return False
    return True


def head(name: str, n: int) -> bytes:
    """The first ``n`` bytes of segment ``name`` (fewer for a shorter one; ``b""`` if it
    does not exist or cannot be read): read, never mapped, so no size can fault."""
    try:
        fd = os.open(SHM_DIR + os_name(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.pread(fd, n, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)


def list_names() -> list[str]:
    """Names of the shmbuf segments of this namespace in ``/dev/shm`` (Linux): regular
    files only, and only names a buffer can have."""
    pre = prefix()
    try:
        with os.scandir(SHM_DIR) as it:
            entries = [(e.name, e) for e in it if e.name.startswith(pre)]
    except OSError:
        return []
    names = []
    for full, entry in entries:
        name = full[len(pre):]
        try:
            regular = entry.is_file(follow_symlinks=False)
        except OSError:
            continue
        if regular and _NAME_RE.fullmatch(name) and len(name) <= MAX_NAME_LEN:
            names.append(name)
    return sorted(names)
