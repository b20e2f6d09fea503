"""The ``shmbuf`` command: ``demo``, and ``ls`` / ``info`` / ``rm`` for live buffers.

Every command works from any process: buffers are found by name in ``/dev/shm``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from . import procs, segment
from .buffer import Buffer
from .layout import FormatError


def describe(name: str) -> dict[str, Any]:
    """Facts about a live buffer, read from its header without disturbing writers."""
    try:
        buf = Buffer.attach(name, timeout=0.5)
    except (FormatError, ValueError) as exc:
        return {"name": name, "error": str(exc)}
    with buf:
        lay = buf._layout
        alive = procs.is_alive(lay.creator_pid, lay.creator_ctime)
        return {"name": name, "rows": len(buf), "capacity": buf.capacity, "lanes": buf.lanes,
                "lane_rows": buf.lane_sizes(), "total_added": buf.total_added,
                "bytes": lay.total_size, "bytes_per_row": lay.row_bytes + 8,
                "persist": buf.persist, "creator_pid": lay.creator_pid, "creator_alive": alive,
                "fields": {k: [list(s), str(d)] for k, (s, d) in buf.fields.items()}}


def _ls(args: argparse.Namespace) -> int:
    names = segment.list_names()
    if args.json:
        print(json.dumps([describe(n) for n in names], indent=2))
        return 0
    if not names:
        print("no shmbuf buffers in /dev/shm")
        return 0
    print(f"{'NAME':30} {'ROWS':>12} {'CAPACITY':>12} {'MiB':>9}  CREATOR")
    for n in names:
        d = describe(n)
        if "error" in d:
            print(f"{n:30} {'?':>12} {'?':>12} {'?':>9}  {d['error']}")
            continue
        owner = f"pid {d['creator_pid']} ({'alive' if d['creator_alive'] else 'dead'})"
        owner += ", persistent" if d["persist"] else ""
        print(f"{n:30} {d['rows']:>12,} {d['capacity']:>12,} {d['bytes'] / 2**20:>9.1f}  {owner}")
    return 0


def _info(args: argparse.Namespace) -> int:
    d = describe(args.name)
    print(json.dumps(d, indent=2))
    return 1 if "error" in d else 0


def _rm(args: argparse.Namespace) -> int:
    status = 0
    for n in args.names:
        if segment.unlink_name(segment.check_name(n)):
            print(f"removed {n}")
        else:
            print(f"no buffer named {n!r}", file=sys.stderr)
            status = 1
    return status


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    print(f"shmbuf demo: {args.workers} rollout workers x {args.envs} CartPole envs write, "
          f"1 learner samples batches of {args.batch}, for {args.seconds:g} s", file=sys.stderr)
    result = demo.run(args.workers, args.envs, args.seconds, args.capacity, args.batch)
    print(demo.table(result))
    return 1 if result["torn rows"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # it has its own options
        from .bench import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="shmbuf", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="rollout workers write while a learner samples")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs", type=int, default=16, help="CartPole envs per worker")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--capacity", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=256)
    p.set_defaults(run=_demo)
    sub.add_parser("bench", help="benchmark against the peers (scripts/bench; bench --help)")
    p = sub.add_parser("ls", help="list the buffers in /dev/shm")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_ls)
    p = sub.add_parser("info", help="describe one buffer (JSON)")
    p.add_argument("name")
    p.set_defaults(run=_info)
    p = sub.add_parser("rm", help="destroy buffers by name")
    p.add_argument("names", nargs="+")
    p.set_defaults(run=_rm)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
