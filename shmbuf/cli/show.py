"""``shmbuf ls``, ``info``, ``stat`` and ``watch``: what the live buffers are doing.

Every buffer is opened as an observer: no stats slot, no lock, nothing written, so
looking never disturbs writers or learners.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from shmbuf.core import files, procs, segment, storage
from shmbuf.actors import weights
from shmbuf.buffer.handle import Buffer
from shmbuf.core.layout import FLAG_PERSIST, MAGIC
from shmbuf.cli.problem import problem


def observe(name: str) -> Buffer:
    """An observer's handle (raises what ``Buffer.attach`` raises)."""
    return Buffer.observe(name)


def describe(name: str) -> dict[str, Any]:
    """Facts about a live buffer, read from its header without disturbing writers.

    A segment that is not a usable buffer gives ``{"name": name, "error": "..."}`` (one
    line), or ``{"name": name, "kind": "weights", ...}`` for :class:`shmbuf.Weights`."""
    try:
        buf = observe(name)
    except FileNotFoundError:
        return {"name": name, "error": "no such buffer (never created, or already removed)"}
    except PermissionError:
        return {"name": name, "error": "permission denied: this user may not read it"}
    except (OSError, ValueError, TimeoutError) as exc:  # FormatError is a ValueError
        if weights.is_weights(name):
            try:
                with weights.Weights.attach(name) as w:
                    return {"name": name, "kind": "weights", "version": w.version, "arrays": w.describe(),
                            "bytes": w.nbytes}
            except (OSError, ValueError):
                pass
        return {"name": name, "error": " ".join(str(exc).split())}
    with buf:
        lay = buf.engine.layout
        alive = procs.is_alive(lay.creator_pid, lay.creator_ctime)
        s = buf.stats()
        writers = {d["writer_pid"] for d in s["lanes"] if d["writer_alive"]}
        writers |= {d["claimed_by"] for d in s["lanes"] if d["claimed_by"] and d["claim_alive"]}
        kind = "queue" if buf.parts.keywords["mode"] == "queue" else lay.meta.get("kind", "buffer")
        where = {"storage": "file", "flushes": buf.engine.flushes} \
            if storage.of(name).kind == "file" else {}
        return {"name": name, **where, "kind": kind, "rows": len(buf),  # (a queue's: its depth)
                "capacity": buf.capacity, "lanes": buf.lanes,
                "lane_rows": buf.lane_sizes(), "total_added": buf.total_added,
                "bytes": lay.total_size, "bytes_per_row": lay.row_bytes + 8,
                "persist": bool(lay.flags & FLAG_PERSIST), "creator_pid": lay.creator_pid,
                "creator_alive": alive, "writers_alive": len(writers), "parts": buf.parts.specs,
                "fields": {k: [list(s_), str(d)] for k, (s_, d) in buf.fields.items()}}


def table(rows: list[list[str]], right: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    """Columns as wide as their widest cell; ``right``: right-aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i in right else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows)


def is_shmbuf(name: str) -> bool:
    """True if segment ``name`` starts with the magic of a buffer or of weights (damaged
    or not): what ``shmbuf ls`` lists. Other programs' segments, empty files and ones
    this user may not read are left out (``shmbuf info NAME`` explains any name)."""
    return segment.head(name, len(MAGIC)) in (MAGIC, weights.MAGIC)


def ls(args: argparse.Namespace) -> int:
    status = 0
    if args.dirs:  # buffer files: regular files that start with a buffer's magic
        names = []
        for d in args.dirs:
            if not os.path.isdir(d):
                problem("ls", d, "not a directory")
                status = 1
            names += files.list_files(d, MAGIC)
    else:
        names = [n for n in segment.list_names() if is_shmbuf(n)]
    found = [describe(n) for n in names]
    found = [d for d in found if not d.get("error", "").startswith("no such buffer")]  # gone meanwhile
    if args.json:
        print(json.dumps(found, indent=2))
        return status
    if not found:
        print(f"no shmbuf buffers in {', '.join(args.dirs) or '/dev/shm'}")
        return status
    rows = [["NAME", "KIND", "ROWS", "CAPACITY", "MiB", "WRITERS", "CREATOR"]]
    for d in found:
        mib = f"{d['bytes'] / 2**20:.1f}" if "bytes" in d else "?"
        if "error" in d:
            rows.append([d["name"], "?", "?", "?", "?", "?", f"unusable: {d['error']}"])
        elif d["kind"] == "weights":
            rows.append([d["name"], "weights", f"v{d['version']}", "-", mib, "-", d["arrays"][:60]])
        else:
            owner = f"pid {d['creator_pid']} ({'alive' if d['creator_alive'] else 'dead'})"
            owner += ", persistent" if d["persist"] else ""
            rows.append([d["name"], d["kind"], f"{d['rows']:,}", f"{d['capacity']:,}", mib,
                         str(d["writers_alive"]), owner])
    print(table(rows, right={2, 3, 4, 5}))
    return status


def info(args: argparse.Namespace) -> int:
    status = 0
    for n in args.names:
        try:
            n = storage.check(n)
        except ValueError as exc:
            problem("info", n, str(exc))
            status = 1
            continue
        d = describe(n)
        if "error" in d:
            problem("info", n, d["error"])
            status = 1
        else:
            print(json.dumps(d, indent=2))
    return status


RATES = {"inserts/s": "rows_inserted", "batches/s": "batches_sampled", "rows sampled/s": "rows_sampled",
         "retries/s": "torn_read_retries", "locks/s": "lock_acquisitions"}


def rates(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    dt = max(after["time"] - before["time"], 1e-9)
    return {k: ((after[v] or 0) - (before[v] or 0)) / dt for k, v in RATES.items()}


def _ago(t: float | None, now: float) -> str:
    return "never" if not t else f"{now - t:.1f} s ago"


def render(s: dict[str, Any], r: dict[str, float] | None) -> str:
    """The text of ``stat``/``watch``: totals, rates, lanes, processes."""
    out = [f"{s['name']}: {s['rows']:,} of {s['capacity']:,} rows, {s['rows_inserted']:,} inserted"]
    if s["batches_sampled"] is None:
        out.append("(this buffer keeps no counters: made by an older shmbuf)")
    else:
        out.append(f"sampled {s['batches_sampled']:,} batches / {s['rows_sampled']:,} rows, "
                   f"{s['torn_read_retries']:,} torn-read retries, {s['redraws']:,} other redraws, "
                   f"{s['lock_acquisitions']:,} lock "
                   f"acquisitions ({s['lock_wait_seconds']:.3f} s waited), {s['writes']:,} writes")
    if "queue_depth" in s:
        out.append(f"queue: {s['queue_depth']:,} rows waiting; {s['rows_taken']:,} taken in {s['takes']:,} "
                   f"takes, {s['rows_given_back']:,} given back by takers that died, {s['rows_skipped']:,} "
                   f"skipped (writers that died); takers waited {s['take_wait_s']:.3f} s, writers "
                   f"{s['write_wait_s']:.3f} s")
    if s.get("sampled_staleness"):
        st = s["sampled_staleness"]
        out.append(f"staleness of the rows sampled by version: mean {st['mean']:.2f}, max {st['max']:,} "
                   f"({st['rows']:,} rows)" + (f"; {s['rows_stale']:,} stale rows passed over by takes"
                                              if "rows_stale" in s else ""))
    if r is not None:
        out.append("rates over the last interval: " + ", ".join(f"{v:,.0f} {k}" for k, v in r.items()))
    now = s["time"]
    if s["lanes"]:
        versions, arena = "newest_version" in s["lanes"][0], "arena_bytes" in s["lanes"][0]
        rows = [["LANE", "ROWS", "INSERTED", "WRITER", "LAST WRITE", "CLAIMED BY"] + ["VERSION"] * versions
                + ["ARENA USED"] * arena]
        for d in s["lanes"]:
            w = "-" if d["writer_pid"] is None else f"{d['writer_pid']} ({'alive' if d['writer_alive'] else 'dead'})"
            rows.append([str(d["lane"]), f"{d['rows']:,}", f"{d['rows_inserted']:,}", w,
                         _ago(d["last_write"], now),
                         "-" if not d["claimed_by"] else
                         f"{d['claimed_by']} ({'alive' if d['claim_alive'] else 'dead'})"]
                        + ([str(d["newest_version"]) if d["newest_version"] is not None else "-"] if versions else [])
                        + ([f"{d['arena_held'] / 2**20:,.1f} of {d['arena_bytes'] / 2**20:,.1f} MiB"] if arena else []))
        out += ["", table(rows, right={0, 1, 2, 6, 7})]
    if s["processes"]:
        rows = [["PID", "ALIVE", "BATCHES", "ROWS SAMPLED", "RETRIES", "WRITES", "LOCKS", "LOCK WAIT"]]
        for p in s["processes"]:
            rows.append([str(p["pid"]), "yes" if p["alive"] else "no", f"{p['batches_sampled']:,}",
                         f"{p['rows_sampled']:,}", f"{p['torn_read_retries']:,}", f"{p['writes']:,}",
                         f"{p['lock_acquisitions']:,}", f"{p['lock_wait_ns'] / 1e9:.3f} s"])
        out += ["", table(rows, right={2, 3, 4, 5, 6, 7})]
    return "\n".join(out)


def open_or_report(command: str, name: str) -> Buffer | None:
    """An observer's handle on ``name``, or None after one line on stderr that says why
    there is none (no such buffer, another user's, not a usable buffer, not ready)."""
    try:
        return observe(name)
    except FileNotFoundError:
        problem(command, name, "no such buffer (never created, or already removed)")
    except (OSError, ValueError, TimeoutError) as exc:
        problem(command, name, " ".join(str(exc).split()))
    return None


def stat(args: argparse.Namespace) -> int:
    buf = open_or_report("stat", args.name)
    if buf is None:
        return 1
    with buf:
        first = buf.stats()
        time.sleep(args.interval)
        s = buf.stats()
    r = rates(first, s)
    if args.json:
        print(json.dumps({**s, "rates": r}, indent=2))
    else:
        print(render(s, r))
    return 0


def watch(args: argparse.Namespace) -> int:
    buf = open_or_report("watch", args.name)
    if buf is None:
        return 1
    tty = sys.stdout.isatty()
    try:
        with buf:
            last = buf.stats()
            n = 0
            while args.count is None or n < args.count:
                time.sleep(args.interval)
                s = buf.stats()
                text = render(s, rates(last, s)) + "\n(Ctrl-C to stop)"
                last = s
                # redraw in place: cursor home, clear to the end of the screen
                sys.stdout.write(("\x1b[H\x1b[J" if tty else "\n") + text + "\n")
                sys.stdout.flush()
                n += 1
    except KeyboardInterrupt:
        pass
    return 0
