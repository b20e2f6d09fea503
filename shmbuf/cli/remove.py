"""``shmbuf rm`` and ``shmbuf gc``: remove buffers by name, or the provably orphaned ones."""

from __future__ import annotations

import argparse
import os

from shmbuf.core import files, segment, storage
from shmbuf.core.layout import MAGIC
from shmbuf.persist import save as persist
from shmbuf.cli.problem import problem
from shmbuf.cli.show import describe


def rm(args: argparse.Namespace) -> int:
    status = 0
    for n in args.names:
        try:
            if storage.of(n).kind == "file":
                _remove_file(storage.check(n))
                print(f"removed {n}")
                continue
            if segment.unlink_name(n):
                print(f"removed {n}")
                continue
            why = "no such buffer"
        except ValueError as exc:
            why = str(exc)
        except PermissionError:
            why = "permission denied: this user may not read or remove it; nothing was removed"
        except OSError as exc:
            why = exc.strerror or str(exc)
        problem("rm", n, why)
        status = 1
    return status


def _remove_file(path: str) -> None:
    """Remove a buffer file; refuse any other file (the path may be a typo)."""
    try:
        os.lstat(path)  # (PermissionError, never "no such file", where a directory is closed to us)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(2, "no such buffer file") from None
    except OSError as exc:
        if isinstance(exc, PermissionError):
            raise
        fd = -1  # (a link, a FIFO...: not a buffer file, said below)
    if fd >= 0:
        os.close(fd)
    if files.head(path, len(MAGIC)) != MAGIC:
        raise ValueError("not a shmbuf buffer file (it does not start with a buffer's header); "
                         "left as it is")
    os.unlink(path)


def gc(args: argparse.Namespace) -> int:
    """Remove buffers whose creator is dead and that were not made with persist=True:
    nobody can be meant to use them (their creator would have removed them on exit).
    Anything else (a live creator, persist=True, weights, an unreadable segment) is left."""
    removed = 0
    for n in segment.list_names():
        d = describe(n)
        if "error" in d or d.get("kind") == "weights" or d["persist"] or d["creator_alive"]:
            continue
        what = f"{n} (creator pid {d['creator_pid']} is dead, not persistent, {d['rows']:,} rows)"
        if args.dry_run:
            print(f"would remove {what}")
            continue
        try:
            gone = segment.unlink_name(n)
        except OSError as exc:
            problem("gc", n, exc.strerror or str(exc))
            continue
        if gone:
            print(f"removed {what}")
            removed += 1
    if not args.dry_run:
        print(f"gc: removed {removed} orphaned buffer{'s' if removed != 1 else ''}")
    return _temporaries(args.dirs, args.dry_run)


def _temporaries(dirs: list[str], dry_run: bool) -> int:
    """``shmbuf gc DIR...``: the temporary directories of killed saves in each DIR."""
    status = removed = 0
    for d in dirs:
        if not os.path.isdir(d):
            problem("gc", d, "not a directory")
            status = 1
            continue
        for t in persist.temporaries(d):
            if dry_run:
                print(f"would remove {t} (the temporary directory of a save that was killed)")
            else:
                persist.clear_temporaries_in([t])
                print(f"removed {t} (the temporary directory of a save that was killed)")
                removed += 1
    if dirs and not dry_run:
        print(f"gc: removed {removed} temporary director{'ies' if removed != 1 else 'y'}")
    return status
