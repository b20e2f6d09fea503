"""A buffer in a file: the same segment, mapped from a regular file on a local disk.

A buffer name with a ``/`` in it is a file path (``"./replay.shmbuf"``,
``"/data/replay.shmbuf"``); everything else is a ``/dev/shm`` name
(:mod:`shmbuf.core.segment`). A :class:`FileSegment` behaves like a
:class:`~shmbuf.core.segment.Segment` (one descriptor per handle, the header lock is an
``flock`` on it, a forked child reopens it) and differs where a file must:

* **It is made whole, then named.** ``create`` builds the file unnamed
  (``O_TMPFILE``), sizes it, reserves its disk space and writes the header; only
  :meth:`FileSegment.publish` links it at its path, and fails if the path was taken
  meanwhile. A creator killed at any instant leaves no file behind (where
  ``O_TMPFILE`` is missing, a hidden ``.NAME.creating-PID`` file is used and removed
  on every error but SIGKILL).
* **Disk space is reserved at create** (``posix_fallocate``): a full disk is an error
  there, never a SIGBUS in a later writer.
* **On btrfs the file is made no-COW** (``chattr +C``, checked; a file that is not is
  refused at attach): a copy-on-write file needs new blocks at every rewrite, which
  the reservation does not cover, so a full disk would be a SIGBUS. A snapshot of the
  subvolume shares its blocks again: do not snapshot a subvolume with a live buffer.
* **Network and FUSE file systems are refused** (NFS, SMB/CIFS, FUSE, 9p, Ceph, ...):
  their ``flock`` and shared mappings do not make the guarantees the protocol needs
  across processes and machines.
* **It is persistent**: no resource tracker, ``close`` never removes it, ``unlink`` does.
* The file is created ``0600``, like a segment, and only a regular file is opened
  (never a link, a FIFO or a device).

Examples:
    >>> import tempfile, os
    >>> tmp = tempfile.TemporaryDirectory(); d = tmp.name
    >>> seg = FileSegment.create(os.path.join(d, "doc.shmbuf"), 4096)
    >>> seg.mmap[0] = 7; seg.publish()
    >>> FileSegment.attach(seg.name).mmap[0]
    7
    >>> seg.unlink(); seg.close(); tmp.cleanup()
    True
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import re
import os
import secrets
import stat

from shmbuf.core.segment import FormatError, Segment, ShmSpaceError, allocate, free_bytes

REFUSED = {"nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "9p", "ceph", "glusterfs",
           "lustre", "gpfs", "afs", "fuse", "fuseblk", "virtiofs", "ncpfs", "coda", "beegfs"}
"""File system types a buffer may not live on (and every ``fuse.*`` subtype)."""


def is_path(name: object) -> bool:
    """True if the buffer name ``name`` is a file path (it has a ``/``)."""
    return isinstance(name, str) and "/" in name


def check_path(path: object) -> str:
    """``path`` made absolute, or ``ValueError`` for a path no file can have."""
    if not isinstance(path, str) or not path or "\0" in path or path.endswith("/"):
        raise ValueError(f"invalid buffer path {path!r}: expected the path of a file, such as "
                         "'/data/replay.shmbuf'")
    return os.path.abspath(path)


def filesystem(path: str, mountinfo: str | None = None) -> str | None:
    """The type of the file system that holds ``path`` (``"ext4"``, ``"nfs4"``, ...), from
    ``/proc/self/mountinfo`` by device number; None where that cannot be told."""
    try:
        dev = os.stat(path).st_dev
        if mountinfo is None:
            with open("/proc/self/mountinfo") as f:
                mountinfo = f.read()
    except OSError:
        return None
    want = f"{os.major(dev)}:{os.minor(dev)}"
    found = by_point = None
    deepest, where = "", os.path.realpath(path)
    for line in mountinfo.splitlines():
        parts = line.split(" ")
        if len(parts) <= 4 or " - " not in line:
            continue
        fs = line.split(" - ", 1)[1].split(" ")[0]
        if parts[2] == want:
            found = fs  # the last mount of it wins
        # (btrfs gives its files a device number of their own: then the deepest mount point)
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])
        if (where == point or where.startswith(point.rstrip("/") + "/")) and len(point) >= len(deepest):
            deepest, by_point = point, fs
    return found if found is not None else by_point


PSEUDO = {"proc", "sysfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore",
          "bpf", "configfs", "efivarfs", "mqueue", "hugetlbfs", "binfmt_misc", "autofs", "fusectl",
          "devtmpfs", "nsfs", "rpc_pipefs", "selinuxfs"}
"""File systems the kernel makes up (``/proc``, ``/sys``, ...): no buffer file can be on them."""


def check_local(directory: str, mountinfo: str | None = None) -> str | None:
    """Refuse a directory on a network, FUSE or pseudo file system, saying which;
    returns its file system's type (None where it cannot be told)."""
    fs = filesystem(directory, mountinfo)
    if fs in PSEUDO:
        raise OSError(errno.EOPNOTSUPP,
                      f"{directory} is on a {fs} file system, which the kernel makes up: it holds no "
                      "regular files a buffer could live in. Use a directory on a local disk")
    if fs is not None and (fs in REFUSED or fs.startswith("fuse.")):
        raise OSError(errno.EOPNOTSUPP,
                      f"{directory} is on a {fs} file system, and a shmbuf buffer cannot live "
                      "there: file locks and shared mappings of network and FUSE file systems "
                      "do not keep the protocol's guarantees between processes. Use a local "
                      "disk (ext4, xfs, btrfs, tmpfs)")
    return fs


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_NOCOW_FL = 0x80086601, 0x40086602, 0x00800000  # linux/fs.h


def _flags(fd: int) -> int:
    """The inode flags of the file ``fd`` (``lsattr``'s); OSError where there are none."""
    flags = bytearray(8)
    fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
    return int.from_bytes(flags[:4], "little")


def no_cow(fd: int, path: str) -> None:
    """On btrfs (copy-on-write): mark the empty file ``fd`` no-COW (``chattr +C``) and
    check it took, or raise. A copy-on-write file gets new blocks at every rewrite, which
    ``posix_fallocate`` does not reserve: once the disk fills up, a write through the
    mapping is a SIGBUS. A no-COW file is rewritten in place, in the blocks reserved at
    create (until a snapshot of its subvolume shares them again)."""
    try:
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, (_flags(fd) | FS_NOCOW_FL).to_bytes(4, "little") + bytes(4))
        flags = _flags(fd)
    except OSError as exc:
        raise OSError(errno.EOPNOTSUPP, f"cannot create buffer {path!r} on btrfs: marking it no-COW "
                      f"(chattr +C) failed ({exc.strerror or exc}), and a copy-on-write file would kill its "
                      "writers with SIGBUS once the disk is full. Use another file system, or a "
                      "directory where no-COW files can be made") from None
    if not flags & FS_NOCOW_FL:
        raise OSError(errno.EOPNOTSUPP, f"cannot create buffer {path!r} on btrfs: the file system did not "
                      "keep it no-COW (chattr +C), and a copy-on-write file would kill its writers with "
                      "SIGBUS once the disk is full. Use another file system")


def check_no_cow(fd: int, path: str) -> None:
    """Refuse a buffer file on btrfs that is not no-COW (made by hand, or copied): its
    writers could die with SIGBUS once the disk is full."""
    try:
        flags = _flags(fd)
    except OSError:
        return  # (cannot be told: as for any file system)
    if not flags & FS_NOCOW_FL:
        raise OSError(errno.EOPNOTSUPP, f"buffer file {path!r} is on btrfs and copy-on-write (not chattr +C): "
                      "its writers could die with SIGBUS once the disk is full. Load it into a new buffer "
                      "file (shmbuf makes them no-COW), e.g. save it with `shmbuf save` and load the copy")


def _space_error(path: str, needed: int) -> ShmSpaceError:
    have = free_bytes(os.path.dirname(path))
    return ShmSpaceError(errno.ENOSPC,
                         f"not enough disk space for buffer {path!r}: it needs {needed:,} bytes and "
                         f"{os.path.dirname(path)} has {'unknown' if have is None else f'{have:,}'} "
                         "bytes free. Use a smaller capacity or another disk")


def _not_found(path: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, f"no buffer file {path!r} exists: create it with "
                             f"Buffer.create(..., path={path!r}); `shmbuf ls DIR` lists buffer files")


def _exists(path: str) -> FileExistsError:
    return FileExistsError(errno.EEXIST, f"{path!r} already exists: attach to it with "
                           f"Buffer.attach({path!r}), pick another path, or remove it with "
                           f"`shmbuf rm {path}`")


class FileSegment(Segment):
    """A :class:`~shmbuf.core.segment.Segment` whose memory is a file (see the module)."""

    durable = True  # (see shmbuf.core.storage)
    kind = "file"
    check_name = staticmethod(check_path)

    @staticmethod
    def check_space(size: int) -> None:
        """(The file's create checks its disk, which it knows only then.)"""

    @classmethod
    def create(cls, name: str, size: int) -> "FileSegment":
        """An unnamed file of ``size`` bytes, its disk space reserved, mapped; call
        :meth:`publish` once it is complete. ``FileExistsError`` if ``name`` is taken,
        :class:`~shmbuf.core.segment.ShmSpaceError` for a full disk (nothing is left)."""
        path = check_path(name)
        if size <= 0:
            raise ValueError(f"segment size must be positive, got {size}")
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            raise FileNotFoundError(errno.ENOENT, f"cannot create buffer {path!r}: the directory "
                                    f"{directory} does not exist")
        fs = check_local(directory)
        if os.path.lexists(path):
            raise _exists(path)
        have = free_bytes(directory)
        if have is not None and size > have:
            raise _space_error(path, size)
        temp = None
        try:
            fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except (AttributeError, OSError):  # no O_TMPFILE here: a hidden name, removed on error
            temp = os.path.join(directory, f".{os.path.basename(path)}.creating-{os.getpid()}-"
                                f"{secrets.token_hex(3)}")
            fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            if fs == "btrfs":
                no_cow(fd, path)  # (on the empty file: btrfs takes it only then)
            os.ftruncate(fd, size)
            try:
                allocate(fd, size)
            except ShmSpaceError:
                raise _space_error(path, size) from None
            seg = cls(path, path, fd, mmap.mmap(fd, size), tracked=False)
            seg.temp_path = temp
            return seg
        except BaseException:
            os.close(fd)
            if temp is not None:
                os.unlink(temp)
            raise

    temp_path: str | None = None  # (where O_TMPFILE is missing: the hidden name it has until published)

    def publish(self) -> None:
        """Give the complete file its path; ``FileExistsError`` if someone took it first
        (then this segment is closed and nothing is left)."""
        try:
            if self.temp_path is not None:
                os.link(self.temp_path, self._os_path)
            else:  # linkat(/proc/self/fd, "N", ..., AT_SYMLINK_FOLLOW): names the unnamed file
                fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.link(str(self.fd), self._os_path, src_dir_fd=fds, follow_symlinks=True)
                finally:
                    os.close(fds)
        except FileExistsError:
            self.close()
            raise _exists(self._os_path) from None
        finally:
            if self.temp_path is not None:
                os.unlink(self.temp_path)
                self.temp_path = None

    @classmethod
    def attach(cls, name: str) -> "FileSegment":
        """Map an existing buffer file (a regular file on a local file system)."""
        path = check_path(name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise _not_found(path) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FormatError(f"{path!r} is a symbolic link; attach to the buffer file itself") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FormatError(f"{path!r} is not a regular file, so not a shmbuf buffer")
            if st.st_size == 0:
                raise FormatError(f"{path!r} is empty, so not a shmbuf buffer")
            if check_local(os.path.dirname(path)) == "btrfs":
                check_no_cow(fd, path)
            return cls(path, path, fd, mmap.mmap(fd, st.st_size), tracked=False)
        except BaseException:
            os.close(fd)
            raise

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._os_path, follow_symlinks=False)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def is_linked(self) -> bool:
        return self._identity() == (self.dev, self.ino)

    def unlink(self) -> bool:
        """Remove the file if its path still names this very file (a file never
        published: its hidden temporary name, where ``O_TMPFILE`` is missing)."""
        if self.temp_path is not None:
            return self._drop_temp()
        if not self.is_linked():
            return False
        try:
            os.unlink(self._os_path)
        except FileNotFoundError:
            return False
        return True

    def _drop_temp(self) -> bool:
        temp, self.temp_path = self.temp_path, None
        try:
            os.unlink(temp)  # type: ignore[arg-type]
        except FileNotFoundError:
            return False
        return True

    def close(self) -> None:
        """Close and unmap; a file never published is removed (nobody can reach it)."""
        if self.temp_path is not None:
            self._drop_temp()
        super().close()

    def untrack(self) -> None:
        """A file is never tracked: it outlives every process."""

    def populate(self, ranges: list[tuple[int, int]]) -> bool:
        """Never prefault a file: its pages may be far more than memory; the kernel pages
        them in as they are touched."""
        return False

    def _open_name(self) -> int:
        return os.open(self._os_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)

    def sync(self, start: int = 0, stop: int | None = None) -> None:
        """Write the mapping's changed pages (of the bytes ``start:stop`` only, if given)
        to the disk and wait for it (``msync(MS_SYNC)``; the whole file: then ``fsync``)."""
        if self.mmap is None:
            raise ValueError(f"buffer file {self.name!r} is closed")
        if stop is None and start == 0:
            self.mmap.flush()
            os.fsync(self.fd)
            return
        lo = start - start % mmap.PAGESIZE
        hi = min(self.size, -(-(self.size if stop is None else stop) // mmap.PAGESIZE) * mmap.PAGESIZE)
        self.mmap.flush(lo, hi - lo)


def head(path: str, n: int) -> bytes:
    """The first ``n`` bytes of the regular file ``path`` (``b""`` if there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.pread(fd, n, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return b""
    finally:
        os.close(fd)


def list_files(directory: str, magic: bytes) -> list[str]:
    """Paths of the regular files in ``directory`` that begin with ``magic``, sorted."""
    try:
        with os.scandir(directory) as it:
            found = [e.path for e in it if e.is_file(follow_symlinks=False)]
    except OSError:
        return []
    return sorted(os.path.abspath(p) for p in found if head(p, len(magic)) == magic)
