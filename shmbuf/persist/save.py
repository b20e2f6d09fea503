"""Save a live buffer to a directory and load it back: no pickle, no stop of the writers.

**Format** (``FORMAT_VERSION`` 3; ``RAGGED_FORMAT_VERSION`` 4 for a buffer with ragged
fields, which adds their values: a shmbuf that reads 3 at most refuses such a save
rather than load its rows without their values). A save is a directory::

    shmbuf.json      metadata (UTF-8 JSON, written last): format name and version,
                     kind ("buffer" or "episodes"), name, capacity, lanes, the fields
                     in schema order ({name, dtype, shape, file}), meta (the
                     segment's: the parts' specs under "parts", the user's ``meta=``
                     under "user"; see :mod:`shmbuf.core.layout`), per lane head / base / episodes, rows
                     sampled (rate limit), the largest priority, the saving handle's
                     RNG state, rows kept, times, and each array file's dtype and shape
    stamps.npy       int64 (capacity,): each slot's stamp, 0 for a slot not saved
    field-NNN.npy    one per field, (capacity, *shape), in schema order (hidden
                     fields such as ``_priority`` too); names are indices, so a field
                     name never becomes a path
    priority.npy     float64 (capacity,), prioritized buffers only: each saved row's
                     leaf ``p**a``, NaN where the row was not in the trees yet
    ragged-NNN-values.npy, ragged-NNN-offsets.npy
                     format 4: per ragged field (NNN its position in the metadata's
                     "ragged" list: {name, dtype, shape, rows, values, offsets}), the values
                     of the rows kept end to end ``(total, *trailing)`` and their
                     offsets, int64 ``(rows kept + 1,)``: row ``i`` (the ``i``-th slot
                     whose stamp is not 0) is ``values[offsets[i]:offsets[i + 1]]``;
                     the ragged part's spec (its fields, ``arena``) is in meta's "parts"

The arrays are plain ``.npy`` files (numpy's own format, any tool reads them), loaded
with memory mapping and ``allow_pickle=False``: loading never runs code, and a large
buffer streams from the page cache into shared memory without a second private copy.
Files the format does not name are ignored. Saves of formats 1 and 2 still load: format 1
kept one flat ``meta``, the user's keys and the library's mixed (read once by
:func:`shmbuf.core.layout.from_flat`), and both kept the capabilities' settings as keys
of it (read once by :func:`shmbuf.parts.legacy`).

**Save** runs beside writers and samplers. The lane positions are read under the
header lock (as long as a writer's reservation holds it); then, chunk by chunk and
without the lock, stamps, rows, stamps again (as :func:`shmbuf.core.contents.copy_rows`). A
row is saved only if it was published inside its lane's window when the positions
were read and its stamp did not change during its copy, so the save holds exactly rows
that were published at one moment, each whole. The ragged values of the rows kept are
then read as ``state_dict`` reads them (:meth:`shmbuf.ragged.rows.Rows.snapshot`, the
checked read): a row whose record was covered after its fixed part was copied is left
out too. The priority leaves are read under the
trees' seqlock, chunk by chunk. Everything goes to a temporary sibling directory
(``.NAME.shmbuf-tmp-PID-START-XXXXXXXX``) that is renamed into place at the end (after
``fsync``): a crash mid-save leaves no directory that loads, and the next save into the
same folder (or ``shmbuf gc DIR``) removes the temporaries of dead processes. The
directory is 0700 and its files 0600, like the segment. A save never writes through a
symbolic link, and ``overwrite`` never deletes a file that is not a save's.

**Load** checks everything before it creates anything (the size against ``/dev/shm``'s
free space from the metadata alone, then metadata types, a schema numpy accepts and
that matches the files, each file's dtype and shape, stamps that name rows of their
slots, ragged values that match the rows kept and fit a lane's arena: the parts'
``check_state``), then creates the buffer and writes the rows back under the header lock, each
lane's kept rows consecutive (see :func:`shmbuf.core.contents.check`); if anything fails after
the create, the new segment is removed.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from shmbuf import parts
from shmbuf.priority import trees as _priority
from shmbuf.core import contents, procs, storage
from shmbuf.core.deadline import Deadline
from shmbuf.core.engine import Engine
from shmbuf.core.layout import FLAG_PERSIST, USER, Layout, dtype_from_json, from_flat, normalize_fields
from shmbuf.rate import limit
from shmbuf.persist.savedir import (META_FILE, Mapped, NpyIn, NpyOut, Progress, check_destination, clear_temporaries,  # noqa: F401
                        clear_temporaries_in, fsync, private_file, remove_tree, temporaries)
from shmbuf.version import __version__

FORMAT = "shmbuf-save"
FORMAT_VERSION = 3
RAGGED_FORMAT_VERSION = 4  # (a buffer with ragged fields: shmbuf that reads 3 at most refuses it)
FLAT_META_FORMAT = 1  # (its meta: the user's keys and the library's in one object)
STAMPS_FILE = "stamps.npy"
PRIORITY_FILE = "priority.npy"
_MAX_META = 64 << 20  # bytes of shmbuf.json we read at most


# -- progress on a terminal ---------------------------------------------------------


def _field_file(i: int) -> str:
    return f"field-{i:03d}.npy"


def _ragged_file(i: int, what: str) -> str:
    return f"ragged-{i:03d}-{what}.npy"


def save(engine: Engine, path: str | os.PathLike, *, overwrite: bool = False,
         progress: bool | None = None, timeout: float) -> dict[str, Any]:
    """Save the buffer of ``engine`` (a live handle's) into the directory ``path``; see
    the module docstring. Returns a summary: path, rows kept, rows left out (being
    written or overwritten during the save), bytes and seconds. ``timeout`` bounds its
    waits (the priority leaves', a queue's quiet, the lock's), one deadline for all."""
    t0 = time.monotonic()
    deadline = Deadline(timeout)
    dest = Path(os.fspath(path))
    check_destination(dest, overwrite)
    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    clear_temporaries(parent)
    pid, ctime = procs.identity()
    tmp = parent / f".{dest.name}.shmbuf-tmp-{pid}-{ctime:.3f}-{secrets.token_hex(4)}"
    tmp.mkdir(mode=0o700)  # (the segment's own permissions: its owner alone)
    ring, layout = engine.ring, engine.layout
    try:
        leaves = engine.priorities.snapshot(deadline.left())
        fields = engine.layout.stored()
        files, data = {}, {}
        # a queue's rows not yet taken, exactly: no take runs during the copy
        try:
            with engine.writes.quiet(deadline.left()) as pos:
                if pos is None:
                    pos = contents.positions(ring, deadline.left())  # (after the leaves: rows newer are synced anew)
                sampled = limit.sampled(ring)
                heads, bases = pos[:, 0].copy(), pos[:, 1].copy()
                for i, (name, (shape, dtype)) in enumerate(fields.items()):
                    files[name] = _field_file(i)
                    data[name] = NpyOut(tmp / files[name], dtype, (layout.capacity,) + shape)
                stamps = np.empty(layout.capacity, np.int64)
                bar = Progress(f"shmbuf save {engine.name}", layout.capacity * (layout.row_bytes + 8), progress)
                kept = contents.copy_rows(ring, heads, bases, data, stamps, progress=bar)
                gone = engine.writes.delivered(stamps)  # (a queue's delivered rows are left out)
                stamps[gone] = 0
                for out in data.values():
                    out.f.flush()
                # the ragged values of the rows kept, read as state_dict reads them: a row whose
                # record was covered after its fixed part was copied is left out (its stamp 0)
                ragged = engine.records.snapshot({"stamps": stamps, "data": Mapped(tmp, files)}).get("ragged", {})
                kept = int(np.count_nonzero(stamps))
                bar.close()
        finally:
            for out in data.values():
                out.f.close()
        values = []
        for i, (k, (v, o)) in enumerate(ragged.items()):
            values.append({"name": k, "dtype": npformat.dtype_to_descr(v.dtype), "shape": list(v.shape),
                           "rows": len(o) - 1, "values": _ragged_file(i, "values"),
                           "offsets": _ragged_file(i, "offsets")})
            for what, a in (("values", v), ("offsets", o)):
                with private_file(tmp / values[-1][what]) as f:
                    np.save(f, a, allow_pickle=False)
        with private_file(tmp / STAMPS_FILE) as f:
            np.save(f, stamps)
        max_priority = None
        if leaves is not None:
            leaf, seq, max_priority = leaves
            rows = stamps // 2 - 1  # (a saved row's sequence number)
            with private_file(tmp / PRIORITY_FILE) as f:
                np.save(f, np.where((stamps > 0) & (seq == rows + 1), leaf, np.nan))
        lo = contents.windows(heads, bases, layout.lane_capacity)
        meta = {
            "format": FORMAT, "format_version": RAGGED_FORMAT_VERSION if values else FORMAT_VERSION,
            "shmbuf": __version__,
            "kind": engine.layout.meta.get("kind", "buffer"), "name": engine.name,
            "capacity": layout.capacity, "lanes": layout.lanes, "persist": bool(engine.layout.flags & FLAG_PERSIST),
            "fields": [{"name": k, "dtype": npformat.dtype_to_descr(np.dtype(d)), "shape": list(s),
                        "file": files[k]} for k, (s, d) in fields.items()],
            "meta": layout.meta,
            "lanes_state": {"head": heads.tolist(), "base": bases.tolist(),
                            "episodes": pos[:, 2].tolist()},
            "sampled": sampled, "max_priority": max_priority,
            "rng": engine.rng.bit_generator.state,
            "rows": kept, "rows_left_out": int((heads - lo).sum()) - kept,
            "saved_at": time.time(),
        }
        if values:
            meta["ragged"] = values
        for f in tmp.iterdir():
            fsync(f)
        with private_file(tmp / META_FILE) as f:  # last: the seal
            f.write(json.dumps(meta, indent=1, default=int).encode("utf-8"))
        fsync(tmp / META_FILE)
        fsync(tmp)
        if dest.exists():  # overwrite: the old save stays whole until the new one is in place
            check_destination(dest, overwrite)  # (still a save: checked again just before)
            old = parent / f".{dest.name}.shmbuf-old-{pid}-{ctime:.3f}-{secrets.token_hex(4)}"
            dest.rename(old)
            tmp.rename(dest)
            remove_tree(old)
        else:
            tmp.rename(dest)
        fsync(parent)
    except BaseException:
        remove_tree(tmp)
        raise
    nbytes = sum(f.stat().st_size for f in dest.iterdir())
    return {"path": str(dest), "rows": meta["rows"], "rows_left_out": meta["rows_left_out"],
            "bytes": nbytes, "seconds": time.monotonic() - t0}


def _bad(path: Path, why: str) -> ValueError:
    return ValueError(f"{str(path)!r} is not a loadable shmbuf save: {why}")


def _get(meta: dict[str, Any], key: str, kind: Any, path: Path) -> Any:
    if key not in meta:
        raise _bad(path, f"{META_FILE} lacks {key!r}")
    v = meta[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise _bad(path, f"{META_FILE}: {key!r} is {v!r}, expected {getattr(kind, '__name__', kind)}")
    return v


def _ints(v: Any, n: int, what: str, path: Path) -> np.ndarray:
    if not isinstance(v, list) or len(v) != n or not all(type(x) is int and 0 <= x < 2**62 for x in v):
        raise _bad(path, f"{META_FILE}: {what} must be {n} integers in [0, 2**62), got {v!r}"[:300])
    return np.array(v, np.int64)


def _array(path: Path, file: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """``path/file`` memory-mapped read-only; must be a ``.npy`` of exactly ``dtype``
    and ``shape`` (no pickle is ever loaded: object dtypes are refused)."""
    f = path / file
    if not f.is_file():
        raise _bad(path, f"{file} is missing")
    try:
        a = np.load(f, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # truncated, not .npy, a pickle, object dtype
        raise _bad(path, f"{file} is not a readable .npy array ({' '.join(str(exc).split())})") from None
    if not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != shape:
        raise _bad(path, f"{file} holds {getattr(a, 'dtype', '?')} {getattr(a, 'shape', '?')}, "
                         f"{META_FILE} says {dtype} {shape}")
    return a


def read(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a save's metadata and arrays (memory-mapped); create nothing.

    Raises ``FileNotFoundError`` (no such directory), or ``ValueError`` that says what is
    wrong (missing, truncated or edited files, another format version, a schema that
    does not match the files, metadata nested too deeply to be a save's)."""
    path = Path(os.fspath(path))
    try:
        return _read(path)
    except RecursionError:
        raise _bad(path, f"{META_FILE} is nested too deeply to be a save's metadata") from None


def _read(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise FileNotFoundError(f"no shmbuf save at {str(path)!r} (not a directory)")
    mf = path / META_FILE
    if not mf.is_file():
        raise _bad(path, f"{META_FILE} is missing (a save interrupted before its end, or not a save)")
    if mf.stat().st_size > _MAX_META:
        raise _bad(path, f"{META_FILE} is larger than {_MAX_META} bytes")
    try:
        meta = json.loads(mf.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(path, f"{META_FILE} is not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _bad(path, f"{META_FILE} does not say format {FORMAT!r}")
    if meta.get("format_version") not in (FLAT_META_FORMAT, 2, FORMAT_VERSION, RAGGED_FORMAT_VERSION):
        raise _bad(path, f"format version {meta.get('format_version')!r}; this shmbuf "
                         f"({__version__}) reads versions {FLAT_META_FORMAT} to {RAGGED_FORMAT_VERSION}")
    capacity = _get(meta, "capacity", int, path)
    lanes = _get(meta, "lanes", int, path)
    name = _get(meta, "name", str, path)
    described = _get(meta, "meta", dict, path)  # (the segment's: see shmbuf.core.layout)
    if meta["format_version"] == FLAT_META_FORMAT:
        described = from_flat(described)
        described.pop("parts", None)  # (a user's key: its settings are read as format 2's)
    elif not isinstance(described.get(USER), dict):
        raise _bad(path, f"{META_FILE}: meta has no object under {USER!r} (the user's metadata)")
    try:
        if "parts" not in described:  # (formats 1 and 2: the capabilities' settings read once, there)
            described = parts.legacy(described)
        opened = parts.Parts(described)
    except (TypeError, ValueError, AttributeError, KeyError, RecursionError) as exc:
        raise _bad(path, f"{META_FILE}: bad settings of the buffer's parts ({' '.join(str(exc).split())})"[:500]) \
            from None
    specs = _get(meta, "fields", list, path)
    try:
        fields = {}
        for s in specs:
            fields[s["name"]] = (tuple(s["shape"]), dtype_from_json(s["dtype"]))
        if len(fields) != len(specs) or not all(isinstance(s["file"], str) for s in specs):
            raise ValueError("repeated field names or a file that is not a string")
        normalize_fields(fields)
        regions = parts.plan(opened.specs, parts.Plan({}, capacity, lanes, {}, False)).regions  # (the arena's)
        layout = Layout.plan(fields, capacity, lanes, meta=described, regions=regions)
    except (TypeError, ValueError, KeyError) as exc:
        raise _bad(path, f"{META_FILE}: bad schema, capacity or lanes ({' '.join(str(exc).split())})"[:500]) from None
    missing = parts.own_fields(opened.specs) - set(fields)
    if missing:
        raise _bad(path, f"{META_FILE}: its parts {sorted(opened.specs)} keep the fields {sorted(missing)}, "
                         "which it does not hold")
    lane_state = _get(meta, "lanes_state", dict, path)
    heads = _ints(lane_state.get("head"), lanes, "lanes_state.head", path)
    bases = _ints(lane_state.get("base"), lanes, "lanes_state.base", path)
    episodes = _ints(lane_state.get("episodes"), lanes, "lanes_state.episodes", path)
    data, files = {}, {}
    for s, f in zip(specs, layout.fields):
        if os.path.basename(s["file"]) != s["file"] or not s["file"].endswith(".npy"):
            raise _bad(path, f"field {f.name!r}: file {s['file']!r} is not a plain .npy name")
        data[f.name] = _array(path, s["file"], f.dtype, (capacity,) + f.shape)
        files[f.name] = path / s["file"]
    stamps = _array(path, STAMPS_FILE, np.dtype(np.int64), (capacity,))
    prio = None
    if opened.keywords["priority"] is not None:
        prio = _array(path, PRIORITY_FILE, np.dtype(np.float64), (capacity,))
    sampled = _get(meta, "sampled", int, path)
    ragged = _ragged(meta, path)
    return {"path": path, "name": name, "kind": meta.get("kind"), "layout": layout,
            "fields": {f.name: (f.shape, f.dtype) for f in layout.fields}, "meta": described, "parts": opened,
            "persist": bool(meta.get("persist")), "heads": heads, "bases": bases,
            "episodes": episodes, "stamps": stamps, "data": data, "files": files, "priority": prio,
            "max_priority": meta.get("max_priority"), "sampled": sampled, "rng": meta.get("rng"),
            "ragged": ragged}


def _ragged(meta: dict[str, Any], path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """The ragged values of a save of format 4 (memory-mapped; None for older formats):
    per field ``(values, offsets)`` of its rows, each file a ``.npy`` of the dtype and
    shape its metadata says (offsets int64 ``(rows + 1,)``). Whether they
    match the rows is the ragged part's check (:func:`shmbuf.ragged.rows.check_values`)."""
    given = meta.get("ragged")
    if meta["format_version"] != RAGGED_FORMAT_VERSION:
        if given is not None:
            raise _bad(path, f"{META_FILE}: format version {meta['format_version']} holds no ragged values, but it "
                             "lists some")
        return None
    if not isinstance(given, list) or not given:
        raise _bad(path, f"{META_FILE}: format {RAGGED_FORMAT_VERSION} lists the ragged values under 'ragged', "
                         f"got {given!r:.200}")
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for s in given:
        try:
            name, dtype, shape, rows = s["name"], dtype_from_json(s["dtype"]), tuple(s["shape"]), s["rows"]
            files = (s["values"], s["offsets"])
            if not isinstance(name, str) or name in out or not shape or \
                    not all(type(d) is int and d >= 0 for d in (*shape, rows)):
                raise ValueError(f"a name used twice, or a bad shape {list(shape)} or count of rows {rows!r}")
        except (TypeError, ValueError, KeyError) as exc:
            raise _bad(path, f"{META_FILE}: bad ragged values {s!r:.200} ({' '.join(str(exc).split())})"[:500]) \
                from None
        for f in files:
            if not isinstance(f, str) or os.path.basename(f) != f or not f.endswith(".npy"):
                raise _bad(path, f"ragged field {name!r}: file {f!r} is not a plain .npy name")
        out[name] = (_array(path, files[0], dtype, shape), _array(path, files[1], np.dtype(np.int64), (rows + 1,)))
    return out


def load(cls: type, path: str | os.PathLike, *, name: str | None, persist: bool,
         restore_rng: bool, seed: Any, timeout: float, progress: bool | None) -> Any:
    """A new buffer (``cls``: Buffer) holding what ``save`` wrote at ``path``; see the
    module docstring. ``timeout`` bounds the waits (for the new buffer's lock, before
    and after its rows are copied in), one deadline for all from the call's start."""
    deadline = Deadline(timeout)
    got = read(path)
    # sizes first, from the metadata alone: a few sparse files may claim a huge buffer
    storage.of(got["name"] if name is None else name).check_space(got["layout"].total_size)
    fields, meta = dict(got["fields"]), dict(got["meta"])
    user = meta.pop(USER)  # the user's, given back as given; the rest: the library's
    described = got["parts"]
    meta.pop("parts")  # (the rest: what the layers on Buffer describe themselves with)
    for own in parts.own_fields(described.specs):  # (create adds them back)
        fields.pop(own, None)
    rng_state = got["rng"]
    check = {"format": contents.FORMAT, "version": contents.VERSION, "fields": got["fields"],
             "capacity": got["layout"].capacity, "lanes": got["layout"].lanes,
             "heads": got["heads"], "bases": got["bases"], "stamps": got["stamps"],
             "data": got["data"], "rng": rng_state if restore_rng else np.random.default_rng().bit_generator.state}
    try:
        # (the buffer's write part checks the rows of its own field; the buffer is made after)
        checked = contents.check(check, got["layout"], got["fields"], described)
        # (the ragged part checks the values of its rows: they match them, and fit its arena)
        checked = described.check_state(got["layout"], {**check, "ragged": got["ragged"]}, checked,
                                         "the save's ragged values")
    except (TypeError, ValueError) as exc:
        raise _bad(got["path"], str(exc)) from None
    if got["ragged"] is not None and checked.get("records") is None:
        raise _bad(got["path"], f"{META_FILE} lists ragged values, but its parts keep no ragged fields")
    checked["episodes"] = got["episodes"]
    prio = got["priority"]
    if prio is not None:
        leaf = np.asarray(prio)
        given = ~np.isnan(leaf)
        most = _priority.largest_leaf(got["layout"].capacity)  # (more: the trees' sum would be infinite)
        if (leaf[given] < 0).any() or (leaf[given] > most).any():
            raise _bad(got["path"], f"{PRIORITY_FILE} holds negative leaves or leaves above {most:g} (the largest "
                                    "p**a a buffer of this capacity holds)")
        top = got["max_priority"]
        if not isinstance(top, (int, float)) or isinstance(top, bool) or not (top >= 0 and math.isfinite(top)):
            raise _bad(got["path"], f"{META_FILE}: max_priority is {top!r}, expected a number >= 0")
        if top > 0:  # (0: none set yet) new rows enter at top**a
            try:
                _priority.check_values([top], 1, "max_priority", described.keywords["priority"],
                                       got["layout"].capacity)
            except ValueError as exc:
                raise _bad(got["path"], f"{META_FILE}: {exc}") from None
    buf = cls.create(fields, got["layout"].capacity, lanes=got["layout"].lanes,
                     name=got["name"] if name is None else name, persist=persist, seed=seed,
                     timeout=timeout, meta=user, _library=meta, _parts=described.specs)
    try:
        if buf.engine.layout.stored() != got["fields"]:  # (cannot happen: create makes the same layout)
            raise _bad(got["path"], "the buffer made from it has another schema")
        lay = buf.engine.layout
        bar = Progress(f"shmbuf load {buf.name}", lay.capacity * (lay.row_bytes + 8), progress)
        buf.prefault()  # its pages mapped at once, not one fault at a time
        if checked["source"] is not None:  # rows move to close holes: gathered from the maps
            contents.restore(buf.engine.ring, checked, deadline.left(), progress=bar, seg=buf.engine.seg)
        else:
            readers = {k: NpyIn(got["files"][k], got["data"][k]) for k in checked["data"]}
            try:
                contents.restore(buf.engine.ring, {**checked, "data": readers}, deadline.left(), progress=bar,
                              seg=buf.engine.seg)
            finally:
                for r in readers.values():
                    r.close()
        bar.close()
        limit.restore_sampled(buf.engine.ring, got["sampled"], deadline.left())
        buf.engine.writes.reset(deadline.left())  # (a queue: every row restored is one not yet taken)
        if prio is not None:
            leaf = np.asarray(prio) if checked["source"] is None else np.asarray(prio)[checked["source"]]
            buf.engine.priorities.restore(leaf, checked["stamps"], float(got["max_priority"]), deadline.left())
        if restore_rng:
            buf.engine.rng = checked["rng"]
    except BaseException:
        buf.unlink()
        buf.close()
        raise
    return buf
