"""The shmbuf command: live buffers (ls, info, stat, watch), snapshots (save, load),
removal (rm, gc), the demo, and doctor (what this installation runs on).

Every command works from any process: buffers are found by name in /dev/shm (in the
namespace of $SHMBUF_NAMESPACE, if set), or, for a name with a ``/``, at that file path. One module per group of verbs: ``show``,
``saves``, ``remove``.

Exit status: 0 on success; 1 if a named buffer is missing or unusable, or could not
be removed, saved or loaded (each problem is one line on stderr, and the other names
are still handled), or the demo saw a torn row or a wrong next observation; 2 for a
usage error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from shmbuf import __version__


def _demo(args: argparse.Namespace) -> int:
    from shmbuf.demo import run as demo

    print(f"shmbuf demo: {args.workers} rollout workers x {args.envs} CartPole envs write, "
          f"1 learner samples batches of {args.batch}, for {args.seconds:g} s", file=sys.stderr)
    result = demo.run(args.workers, args.envs, args.seconds, args.capacity, args.batch)
    print(demo.table(result))
    return 1 if result["torn rows"] or result["wrong next"] else 0


def _positive(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def parser() -> argparse.ArgumentParser:
    from shmbuf.cli import doctor, remove, saves, show

    p = argparse.ArgumentParser(
        prog="shmbuf", description="A replay buffer in shared memory that many processes write "
        "and sample at once.", epilog="Exit status: 0 success; 1 a named buffer is missing, "
        "unusable or could not be removed, saved or loaded (one line each on stderr), or the demo "
        "saw a torn row or a wrong next observation; 2 usage error.")
    p.add_argument("--version", action="version", version=f"shmbuf {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser(
        "demo", help="rollout workers write episodes while a learner samples",
        description="Rollout worker processes (each with its own vectorised CartPole, one lane "
        "per env) write episodes into one shared EpisodeBuffer while this process samples "
        "transitions and whole episodes, and checks every sampled transition for tears and for "
        "its next observation. Prints a table of steps written, episodes and their returns, "
        "batches sampled, torn rows and wrong next observations (always 0).")
    c.add_argument("--workers", type=int, default=2, help="rollout worker processes (default 2)")
    c.add_argument("--envs", type=int, default=16, help="CartPole envs per worker (default 16)")
    c.add_argument("--seconds", type=float, default=10.0, help="how long to run (default 10)")
    c.add_argument("--capacity", type=int, default=100_000, help="buffer rows (default 100000)")
    c.add_argument("--batch", type=int, default=256, help="rows per sampled batch (default 256)")
    c.set_defaults(run=_demo)
    c = sub.add_parser("doctor", help="which path runs, /dev/shm's space, the optional dependencies",
                       description="Say what this installation runs on: the native (C) or the "
                       "pure-Python path and why, the extension's file, Python and numpy, the free "
                       "space of /dev/shm, the namespace, and which optional dependencies are "
                       "installed, with their versions.")
    c.add_argument("--json", action="store_true", help="print JSON instead of text")
    c.set_defaults(run=doctor.doctor)
    c = sub.add_parser("ls", help="list the buffers in /dev/shm (or the buffer files in DIRs)",
                       description="List this namespace's buffers (and shmbuf.Weights), or with DIR "
                       "the buffer files in each DIR: kind, rows, capacity, size, live writers, "
                       "creator. Reads headers only.")
    c.add_argument("dirs", nargs="*", metavar="DIR", help="directories of buffer files")
    c.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c.set_defaults(run=show.ls)
    c = sub.add_parser("info", help="describe buffers (JSON)",
                       description="Print each named buffer's header facts as JSON (a NAME "
                       "with a '/' is the path of a buffer file).")
    c.add_argument("names", nargs="+", metavar="NAME")
    c.set_defaults(run=show.info)
    c = sub.add_parser("stat", help="a buffer's counters and rates",
                       description="Counters every handle keeps in the segment (rows inserted, "
                       "batches and rows sampled, torn-read retries, lock acquisitions and time "
                       "waited, writes), their rates over --interval, and per lane the last "
                       "writer (alive or dead) and last write.")
    c.add_argument("name", metavar="NAME")
    c.add_argument("--interval", type=_positive, default=1.0, help="seconds the rates cover (default 1)")
    c.add_argument("--json", action="store_true", help="print JSON instead of text")
    c.set_defaults(run=show.stat)
    c = sub.add_parser("watch", help="stat, redrawn live until Ctrl-C",
                       description="Redraw `shmbuf stat NAME` in place every --interval seconds "
                       "until Ctrl-C.")
    c.add_argument("name", metavar="NAME")
    c.add_argument("--interval", type=_positive, default=1.0, help="seconds between redraws (default 1)")
    c.add_argument("--count", type=int, default=None, help="stop after this many redraws")
    c.set_defaults(run=show.watch)
    c = sub.add_parser("save", help="snapshot a live buffer into a directory",
                       description="Save buffer NAME into directory DIR while its writers keep "
                       "writing (JSON metadata and .npy files; the format: docs/guides/save-load.md).")
    c.add_argument("name", metavar="NAME")
    c.add_argument("dir", metavar="DIR")
    c.add_argument("--overwrite", action="store_true", help="replace an earlier save in DIR")
    c.add_argument("--timeout", type=_positive, default=10.0, help="seconds to wait for the header lock")
    c.set_defaults(run=saves.save)
    c = sub.add_parser("load", help="restore a saved buffer (persistent)",
                       description="Create a buffer from the save in DIR, named NAME (default: "
                       "the saved name). It is persistent: it outlives this command until "
                       "`shmbuf rm NAME`.")
    c.add_argument("dir", metavar="DIR")
    c.add_argument("name", metavar="NAME", nargs="?", default=None)
    c.add_argument("--timeout", type=_positive, default=10.0, help="seconds to wait for the header lock")
    c.set_defaults(run=saves.load)
    c = sub.add_parser("rm", help="destroy buffers by name",
                       description="Remove buffers' names (a NAME with a '/' is the path of a "
                       "buffer file: removed only if it is one); processes attached keep working "
                       "until they close.")
    c.add_argument("names", nargs="+", metavar="NAME")
    c.set_defaults(run=remove.rm)
    c = sub.add_parser("gc", help="remove orphaned buffers",
                       description="Remove the buffers whose creator died and that were not "
                       "created with persist=True (nobody can be meant to use them), and say "
                       "which. Live creators, persistent buffers, weights and unreadable "
                       "segments are left alone. With DIRs: also the temporary directories "
                       "that saves into them left when they were killed (their save files; "
                       "nothing else is deleted).")
    c.add_argument("dirs", nargs="*", metavar="DIR", help="folders that saves were written into")
    c.add_argument("--dry-run", action="store_true", help="list what would be removed")
    c.set_defaults(run=remove.gc)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
