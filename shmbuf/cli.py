"""The shmbuf command: demo, bench, and ls / info / rm for live buffers.

Every command works from any process: buffers are found by name in /dev/shm (in the
namespace of $SHMBUF_NAMESPACE, if set).

Exit status: 0 on success; 1 if a named buffer is missing or unusable, or could not
be removed (each problem is one line on stderr, and the other names are still
handled), or the demo saw a torn row or a wrong next observation; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from . import __version__, procs, segment
from .buffer import Buffer


def describe(name: str) -> dict[str, Any]:
    """Facts about a live buffer, read from its header without disturbing writers.

    A buffer that cannot be read gives ``{"name": name, "error": "..."}`` (one line)."""
    try:
        buf = Buffer.attach(name, timeout=0.5)
    except FileNotFoundError:
        return {"name": name, "error": "no such buffer (never created, or already removed)"}
    except PermissionError:
        return {"name": name, "error": "permission denied (another user's buffer)"}
    except (OSError, ValueError, TimeoutError) as exc:  # FormatError is a ValueError
        return {"name": name, "error": " ".join(str(exc).split())}
    with buf:
        lay = buf._layout
        alive = procs.is_alive(lay.creator_pid, lay.creator_ctime)
        return {"name": name, "rows": len(buf), "capacity": buf.capacity, "lanes": buf.lanes,
                "lane_rows": buf.lane_sizes(), "total_added": buf.total_added,
                "bytes": lay.total_size, "bytes_per_row": lay.row_bytes + 8,
                "persist": buf.persist, "creator_pid": lay.creator_pid, "creator_alive": alive,
                "fields": {k: [list(s), str(d)] for k, (s, d) in buf.fields.items()}}


def _problem(command: str, name: str, why: str) -> None:
    shown = name if name.isprintable() else repr(name)
    print(f"shmbuf {command}: {shown}: {why}", file=sys.stderr)


def _ls(args: argparse.Namespace) -> int:
    found = [describe(n) for n in segment.list_names()]
    found = [d for d in found if not d.get("error", "").startswith("no such buffer")]  # gone meanwhile
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    if not found:
        print("no shmbuf buffers in /dev/shm")
        return 0
    print(f"{'NAME':30} {'ROWS':>12} {'CAPACITY':>12} {'MiB':>9}  CREATOR")
    for d in found:
        n = d["name"]
        if "error" in d:
            print(f"{n:30} {'?':>12} {'?':>12} {'?':>9}  unusable: {d['error']}")
            continue
        owner = f"pid {d['creator_pid']} ({'alive' if d['creator_alive'] else 'dead'})"
        owner += ", persistent" if d["persist"] else ""
        print(f"{n:30} {d['rows']:>12,} {d['capacity']:>12,} {d['bytes'] / 2**20:>9.1f}  {owner}")
    return 0


def _info(args: argparse.Namespace) -> int:
    status = 0
    for n in args.names:
        try:
            segment.check_name(n)
        except ValueError as exc:
            _problem("info", n, str(exc))
            status = 1
            continue
        d = describe(n)
        if "error" in d:
            _problem("info", n, d["error"])
            status = 1
        else:
            print(json.dumps(d, indent=2))
    return status


def _rm(args: argparse.Namespace) -> int:
    status = 0
    for n in args.names:
        try:
            if segment.unlink_name(n):
                print(f"removed {n}")
                continue
            why = "no such buffer"
        except ValueError as exc:
            why = str(exc)
        except PermissionError:
            why = "permission denied (another user's buffer)"
        except OSError as exc:
            why = exc.strerror or str(exc)
        _problem("rm", n, why)
        status = 1
    return status


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    print(f"shmbuf demo: {args.workers} rollout workers x {args.envs} CartPole envs write, "
          f"1 learner samples batches of {args.batch}, for {args.seconds:g} s", file=sys.stderr)
    result = demo.run(args.workers, args.envs, args.seconds, args.capacity, args.batch)
    print(demo.table(result))
    return 1 if result["torn rows"] or result["wrong next"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # it has its own options
        from .bench import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="shmbuf", description="A replay buffer in shared memory that many processes write "
        "and sample at once.", epilog="Exit status: 0 success; 1 a named buffer is missing, "
        "unusable or could not be removed (one line each on stderr), or the demo saw a torn "
        "row or a wrong next observation; 2 usage error.")
    parser.add_argument("--version", action="version", version=f"shmbuf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "demo", help="rollout workers write episodes while a learner samples",
        description="Rollout worker processes (each with its own vectorised CartPole, one lane "
        "per env) write episodes into one shared EpisodeBuffer while this process samples "
        "transitions and whole episodes, and checks every sampled transition for tears and for "
        "its next observation. Prints a table of steps written, episodes and their returns, "
        "batches sampled, torn rows and wrong next observations (always 0).")
    p.add_argument("--workers", type=int, default=2, help="rollout worker processes (default 2)")
    p.add_argument("--envs", type=int, default=16, help="CartPole envs per worker (default 16)")
    p.add_argument("--seconds", type=float, default=10.0, help="how long to run (default 10)")
    p.add_argument("--capacity", type=int, default=100_000, help="buffer rows (default 100000)")
    p.add_argument("--batch", type=int, default=256, help="rows per sampled batch (default 256)")
    p.set_defaults(run=_demo)
    sub.add_parser("bench", help="benchmark against the peers (see: shmbuf bench --help)")
    p = sub.add_parser("ls", help="list the buffers in /dev/shm",
                       description="List this namespace's buffers: rows, capacity, size, creator.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=_ls)
    p = sub.add_parser("info", help="describe buffers (JSON)",
                       description="Print each named buffer's header facts as JSON.")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(run=_info)
    p = sub.add_parser("rm", help="destroy buffers by name",
                       description="Remove buffers' names; processes attached keep working "
                       "until they close.")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(run=_rm)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
