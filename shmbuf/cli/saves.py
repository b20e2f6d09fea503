"""``shmbuf save`` and ``shmbuf load``: snapshots of live buffers (see shmbuf.persist.save)."""

from __future__ import annotations

import argparse

from shmbuf.buffer.handle import Buffer
from shmbuf.cli.problem import problem
from shmbuf.cli.show import open_or_report


def save(args: argparse.Namespace) -> int:
    buf = open_or_report("save", args.name)
    if buf is None:
        return 1
    with buf:
        try:
            got = buf.save(args.dir, overwrite=args.overwrite, timeout=args.timeout)
        except (OSError, ValueError, TimeoutError) as exc:
            problem("save", args.name, " ".join(str(exc).split()))
            return 1
    print(f"saved {args.name} to {got['path']}: {got['rows']:,} rows "
          f"({got['rows_left_out']:,} in flight left out), {got['bytes'] / 2**20:,.1f} MiB "
          f"in {got['seconds']:.2f} s")
    return 0


def load(args: argparse.Namespace) -> int:
    try:
        buf = Buffer.load(args.dir, name=args.name, persist=True, timeout=args.timeout)
    except FileExistsError as exc:
        problem("load", args.name or args.dir, " ".join(str(exc).split()))
        return 1
    except (OSError, ValueError, TimeoutError) as exc:
        problem("load", args.dir, " ".join(str(exc).split()))
        return 1
    with buf:
        print(f"loaded {args.dir} as {buf.name}: {len(buf):,} of {buf.capacity:,} rows "
              f"(persistent: remove it with `shmbuf rm {buf.name}`)")
    return 0
