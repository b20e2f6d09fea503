"""A buffer's contents as a plain dict (``state_dict``) and back (``load_state_dict``).

**Snapshot** (:func:`snapshot`) runs beside writers and samplers. The lane positions
are read under the lock; stamps, data, stamps again are read outside it. A row is
kept only if its stamp was the same published value before and after the data copy
*and* names a row inside its lane's saved window; every other stamp is stored as 0,
so a row reserved but unwritten at snapshot time, or overwritten during the copy, is
never sampled after a restore.

**Restore** (:func:`check` then :func:`restore`). Everything in the dict is checked
first; a bad dict raises ``ValueError``/``TypeError`` and changes nothing. Then, under
the header lock (new writes wait, up to their timeout) and once every live writer in
flight has published, the rows are written back **renumbered**: each lane's sequence
numbers move up by a multiple of its capacity, past every number the lane has used.
Slots, order and samples stay the same, but no stamp after the restore equals one
from before it, so a sampler whose copy straddles the restore always sees a changed
stamp and draws again (the seqlock check stays exact). ``total_added`` grows by the
renumbering; ``len()`` and the rows are as saved.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from shmbuf.core import durable, gather
from shmbuf.core.deadline import Deadline
from shmbuf.core.layout import LANE_BASE, LANE_CLAIM_PID, LANE_EPISODES, LANE_FLUSHED, LANE_HEAD, LANE_OWN_COUNT, RES_PID, Layout
from shmbuf.core.layout import published
from shmbuf.core.lock import LockTimeout
from shmbuf.core.ring import Ring

FORMAT = "shmbuf.Buffer"
VERSION = 1


def windows(heads: np.ndarray, bases: np.ndarray, lc: int) -> np.ndarray:
    """Per lane, the lowest sequence number that counts (see ``Ring.window``)."""
    return np.maximum(np.minimum(bases, heads), heads - lc)


def _div(a: np.ndarray, m: int) -> np.ndarray:
    """``a // m`` for integers ``0 <= a < 2**52`` through float division: numpy's integer
    division costs about 30 ns an element here, this a few (exact: the float quotient
    is off by at most one, which the correction undoes)."""
    q = (a / m).astype(np.int64)
    q -= a < q * m
    q += a >= (q + 1) * m
    return q


def _in_window(stamps: np.ndarray, heads: np.ndarray, bases: np.ndarray, lc: int,
               first_slot: int = 0) -> np.ndarray:
    """Which stamps (of the slots ``first_slot ..``) name a published row inside its
    lane's window ``lo .. head``."""
    lane = _div(first_slot + np.arange(len(stamps)), lc)
    seq = (stamps >> 1) - 1
    lo = windows(heads, bases, lc)
    return (stamps > 0) & ((stamps & 1) == 0) & (seq >= lo[lane]) & (seq < heads[lane])


def positions(ring: Ring, timeout: float) -> np.ndarray:
    """Every lane's ``[head, base, episodes]``, read together under the lock (a header
    read: writers wait for it no longer than for another writer's reservation)."""
    with ring.lock.hold(timeout):
        return ring.lane_table[:, [LANE_HEAD, LANE_BASE, LANE_EPISODES]].copy()


def copy_rows(ring: Ring, heads: np.ndarray, bases: np.ndarray, data: Mapping[str, Any],
              stamps: Any, chunk_bytes: int = 2 << 20, progress: Any = None) -> int:
    """Copy the rows of the lane windows ``heads``/``bases`` into ``data`` (``{field: array
    of capacity rows}``, private arrays or files written front to back), slot order,
    about ``chunk_bytes`` at a time, through the read path's checked gather
    (:func:`shmbuf.core.gather.copy_windows`); into ``stamps`` each slot's stamp if its
    row was copied intact, else 0 (and zeros into ``data``). No lock is held: rows
    written or overwritten meanwhile are left out. Returns the rows kept;
    ``progress(bytes)`` is called after each chunk."""
    kept, lc, fields = 0, ring.lane_capacity, ring.layout.fields
    per_row = ring.layout.row_bytes + 8
    chunk = max(1, chunk_bytes // per_row)
    oldest = windows(heads, bases, lc)
    for lo in range(0, ring.layout.capacity, chunk):
        hi = min(lo + chunk, ring.layout.capacity)
        slot = np.arange(lo, hi)
        lane = _div(slot, lc)
        head = heads[lane]
        seq = head - 1 - (head - 1 - (slot - lane * lc)) % lc  # the newest row of its lane in the slot
        live = np.flatnonzero(seq >= oldest[lane])
        out = [np.zeros((hi - lo,) + f.shape, f.dtype) for f in fields]
        if len(live) == hi - lo:  # (the common case: the copy goes straight into out)
            ok = gather.copy_windows(ring, lane, seq, 1, None, out)
        elif len(live):
            got = [np.empty((len(live),) + f.shape, f.dtype) for f in fields]
            ok = gather.copy_windows(ring, lane[live], seq[live], 1, None, got)
            for dst, src in zip(out, got):
                dst[live] = src
        if len(live):
            good = live if ok is None else live[ok]
            if ok is not None:
                for dst in out:
                    dst[live[~ok]] = 0
            stamp = np.zeros(hi - lo, np.int64)
            stamp[good] = published(seq[good])
            kept += len(good)
        else:
            stamp = np.zeros(hi - lo, np.int64)
        stamps[lo:hi] = stamp
        for f, dst in zip(fields, out):
            data[f.name][lo:hi] = dst
        if progress is not None:
            progress((hi - lo) * per_row)
    return kept


def snapshot(ring: Ring, fields: dict[str, Any], rng_state: dict[str, Any],
             timeout: float, writes: Any) -> dict[str, Any]:
    """A consistent copy of ``ring``'s rows (see the module docstring). ``writes``: the
    engine's write part (:mod:`shmbuf.core.plain`), held quiet during the copy (a
    queue's: its rows not yet taken, exactly; delivered ones are left out). ``timeout``
    bounds its waits (the write part's quiet, then the lock), one deadline for both."""
    deadline = Deadline(timeout)
    data = {name: np.empty_like(a) for name, a in ring.arrays.items()}
    stamps = np.empty(ring.layout.capacity, np.int64)
    with writes.quiet(deadline.left()) as pos:
        if pos is None:  # (a queue's positions come with its quiet)
            pos = positions(ring, deadline.left())
        copy_rows(ring, pos[:, 0], pos[:, 1], data, stamps)
        stamps[writes.delivered(stamps)] = 0
    heads, bases = pos[:, 0].copy(), pos[:, 1].copy()
    return {"format": FORMAT, "version": VERSION, "fields": fields,
            "capacity": ring.layout.capacity, "lanes": ring.lanes,
            "heads": heads, "bases": bases, "stamps": stamps, "data": data,
            "rng": rng_state}


def _int_array(state: Mapping[str, Any], key: str, n: int) -> np.ndarray:
    a = np.asarray(state[key])
    if a.shape != (n,) or a.dtype.kind not in "iu":
        raise ValueError(f"state_dict[{key!r}] must be {n} integers, got shape {a.shape} "
                         f"and dtype {a.dtype}")
    if n and (a.min() < 0 or a.max() >= 2**62):
        raise ValueError(f"state_dict[{key!r}] holds values outside [0, 2**62)")
    return a.astype(np.int64)


def sequence_fields(layout: Layout) -> tuple[str, ...]:
    """The fields whose values are sequence numbers of their own lane, moved along when
    a restore renumbers rows: an episode buffer's ``_start`` (see shmbuf.episodes.rows)."""
    return ("_start",) if layout.meta.get("kind") == "episodes" else ()


def check(state: Any, layout: Layout, fields: dict[str, Any], writes: Any) -> dict[str, Any]:
    """Validate a state dict for a buffer of ``layout``; return it normalised, every
    lane made contiguous (its published rows, consecutive: see :func:`_contiguous`).
    ``writes``: the buffer's write part (or its class), whose ``check_rows`` checks the
    values of the field it keeps.

    Raises ``ValueError``/``TypeError`` that say what is wrong; touches nothing.
    """
    if not isinstance(state, Mapping) or state.get("format") != FORMAT:
        raise ValueError("not a shmbuf state_dict (expected the output of Buffer.state_dict())")
    if state.get("version") != VERSION:
        raise ValueError(f"state_dict version {state.get('version')!r}; this shmbuf reads "
                         f"version {VERSION}")
    missing = [k for k in ("fields", "capacity", "lanes", "heads", "bases", "stamps", "data", "rng")
               if k not in state]
    if missing:
        raise ValueError(f"state_dict lacks {missing}")
    theirs = (state["fields"], state["capacity"], state["lanes"])
    if theirs != (fields, layout.capacity, layout.lanes):
        raise ValueError(
            f"state_dict is for fields={theirs[0]}, capacity={theirs[1]}, lanes={theirs[2]}; "
            f"this buffer has fields={fields}, capacity={layout.capacity}, lanes={layout.lanes}")
    lc = layout.lane_capacity
    heads = _int_array(state, "heads", layout.lanes)
    bases = _int_array(state, "bases", layout.lanes)
    if (bases > heads).any():
        raise ValueError(f"state_dict has a lane whose base is beyond its head: bases {bases.tolist()}, "
                         f"heads {heads.tolist()}")
    stamps = np.asarray(state["stamps"])
    if stamps.shape != (layout.capacity,) or stamps.dtype.kind not in "iu":
        raise ValueError(f"state_dict['stamps'] must be {layout.capacity} integers, got shape "
                         f"{stamps.shape} and dtype {stamps.dtype}")
    stamps = stamps.astype(np.int64)
    index = np.arange(layout.capacity)
    slot = index - _div(index, lc) * lc
    named = stamps != 0
    seq = (stamps[named] >> 1) - 1
    if seq.size and seq.max() >= 2**52:  # (beyond _div's range: numpy's own division)
        wrong = seq % lc != slot[named]
    else:
        wrong = seq - _div(np.maximum(seq, 0), lc) * lc != slot[named]
    if (stamps[named] & 1).any() or wrong.any():
        raise ValueError("state_dict['stamps'] holds stamps that name no row of their slot "
                         "(corrupt or edited)")
    stamps = np.where(_in_window(stamps, heads, bases, lc), stamps, 0)
    kept = np.flatnonzero(stamps)  # (the slots of the rows restored)
    stamps, heads, bases, source, delta = _contiguous(stamps, heads, bases, lc)
    data = state["data"]
    if not isinstance(data, Mapping) or set(data) != set(fields):
        raise ValueError(f"state_dict['data'] must hold exactly the fields {list(fields)}, got "
                         f"{list(data) if isinstance(data, Mapping) else type(data).__name__}")
    arrays = {}
    for name, (shape, dtype) in fields.items():
        a = np.asarray(data[name])
        if a.shape != (layout.capacity,) + shape or not np.can_cast(a.dtype, dtype, "safe"):
            raise ValueError(f"state_dict['data'][{name!r}] must have shape "
                             f"{(layout.capacity,) + shape} and dtype {dtype}, got {a.shape} {a.dtype}")
        arrays[name] = a
    writes.check_rows(arrays, kept)  # (a write part's own field: max_times_sampled's counts)
    rng = np.random.default_rng()
    try:
        rng.bit_generator.state = state["rng"]
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"state_dict['rng'] is not a PCG64 generator state ({exc})") from None
    return {"heads": heads, "bases": bases, "stamps": stamps, "data": arrays, "rng": rng,
            "source": source, "delta": delta, "renumber": sequence_fields(layout)}


def _contiguous(stamps: np.ndarray, heads: np.ndarray, bases: np.ndarray,
                lc: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Make every lane's kept rows (``stamps`` not 0) consecutive, so that a restored
    lane holds exactly its published rows (the rows a state left out, being written or
    overwritten while it was taken, would otherwise stay reserved slots nothing ever
    publishes). Each lane's window starts at its first kept row (base) and ends after its
    last one (head); rows after a hole move down to close it, keeping their order.

    Returns the new stamps, heads and bases, and, if any row moves, per slot the slot
    its row comes from and how far its sequence number moved (``delta``, <= 0: for
    fields that hold sequence numbers of the lane, such as an episode's first row), else
    None and None."""
    kept = np.flatnonzero(stamps)
    lanes = len(heads)
    seq = (stamps[kept] >> 1) - 1
    lane = _div(kept, lc)
    order = np.lexsort((seq, lane))  # by lane, then sequence number
    kept, seq, lane = kept[order], seq[order], lane[order]
    count = np.bincount(lane, minlength=lanes)
    begin = np.concatenate(([0], np.cumsum(count)[:-1]))
    first = heads.astype(np.int64)  # an empty lane: an empty window at its head
    has = count > 0
    first[has] = seq[begin[has]]
    new_bases, new_heads = first, first + count
    new_seq = first[lane] + (np.arange(len(seq)) - begin[lane])
    if np.array_equal(new_seq, seq):
        return stamps, new_heads, new_bases, None, None
    dest = lane * lc + new_seq % lc
    out = np.zeros_like(stamps)
    out[dest] = published(new_seq)
    source = np.arange(len(stamps))
    source[dest] = kept
    delta = np.zeros(len(stamps), np.int64)
    delta[dest] = new_seq - seq
    return out, new_heads, new_bases, source, delta


def restore(ring: Ring, checked: dict[str, Any], timeout: float, chunk_bytes: int = 1 << 20,
            progress: Any = None, seg: Any = None) -> None:
    """Write a :func:`check`-ed state into ``ring`` (see the module docstring), about
    ``chunk_bytes`` at a time, calling ``progress(bytes)`` after each.

    ``seg``: the ring's segment. For a buffer file, the disk stops vouching for any row
    before the first slot is overwritten (the flush frontiers zeroed and the header
    written to the disk: a power loss during the restore leaves an empty buffer, never a
    row half old, half restored), and the restored rows are flushed before this returns.

    ``timeout`` bounds the waits, one deadline for all: for the lock, for the writers in
    flight, and (a buffer file) the flush's for the lock after the copy, which gets what
    is left, at least ``LOCK_FLOOR``. The copy and the disk writes are not interrupted.
    Raises ``LockTimeout`` or ``TimeoutError`` (nothing changed) if the lock, or the
    writers in flight, take longer than ``timeout``; if the flush's wait does, the rows
    are restored and its error says they are not on the disk yet.
    """
    deadline = Deadline(timeout)
    lc = ring.lane_capacity
    durable_file = seg is not None and seg.durable
    with ring.lock.hold(deadline.left()):
        claims = ring.live_claims()
        if claims:
            raise RuntimeError(
                f"load_state_dict: lanes {sorted(claims)} are claimed by live processes "
                f"{sorted(set(claims.values()))}; a lane's owner writes without the lock, so a "
                "restore cannot hold it off. Release the lanes (release_lane(), or close the "
                "writers' handles) first; nothing was changed")
        delay = 0.0
        while ring.live_writers_in_flight():  # they publish without the lock: let them
            if time.monotonic() >= deadline.at:
                raise TimeoutError(f"load_state_dict: writers still in flight after {timeout:g} s; "
                                   "nothing was changed. Retry, or pass a larger timeout=")
            time.sleep(delay)
            delay = min(max(2 * delay, 1e-4), 1e-2)
        ring.res[:, RES_PID] = 0  # what is left belongs to dead writers
        ring.lane_table[:, LANE_FLUSHED] = 0  # a buffer file's disk vouches for no row from here
        if durable_file:
            seg.sync(0, ring.layout.rows_offset)  # (on the disk before any slot changes)
        ring.lane_table[:, LANE_OWN_COUNT] = 0
        ring.lane_table[:, LANE_CLAIM_PID] = 0
        now = ring.lane_table[:, LANE_HEAD].copy()
        lo = windows(checked["heads"], checked["bases"], lc)
        shift = -(-np.maximum(now - lo, 0) // lc) * lc  # per lane: past every number used
        stamps = checked["stamps"]
        lane = np.arange(len(stamps)) // lc
        new_stamps = np.where(stamps != 0, stamps + 2 * shift[lane], 0)
        ring.stamps[:] = 0
        # rows a chunk at a time, every field of a chunk before the next chunk: packed
        # fields share cache lines, so the chunk's row block is written while it is cached
        chunk = max(1, chunk_bytes // (ring.layout.row_bytes + 8))
        fills = {name: getattr(src, "copy_to", None)  # a file reader (shmbuf.persist.save) fills itself
                 for name, src in checked["data"].items()}
        source, delta = checked.get("source"), checked.get("delta")
        moved = set(checked.get("renumber", ()))
        for lo in range(0, ring.layout.capacity, chunk):
            for name, a in ring.arrays.items():
                fill = fills[name]
                if source is not None:  # rows moved to close holes (see _contiguous)
                    a[lo:lo + chunk] = checked["data"][name][source[lo:lo + chunk]]
                    if name in moved:  # (sequence numbers of the lane: moved along)
                        a[lo:lo + chunk] += delta[lo:lo + chunk]
                elif fill is not None:
                    fill(lo, a[lo:lo + chunk])
                else:
                    a[lo:lo + chunk] = checked["data"][name][lo:lo + chunk]
            if progress is not None:
                progress(min(chunk, ring.layout.capacity - lo) * (ring.layout.row_bytes + 8))
        if checked.get("records") is not None:  # (a buffer with ragged fields: their values, placed anew)
            ring.records.restore(*checked["records"])
        if checked.get("episodes") is not None:  # (an episode buffer's episode numbers)
            ring.lane_table[:, LANE_EPISODES] = checked["episodes"]
        # head before base: a sampler reads base before head (Ring.window), so it never
        # sees a new base with an old head, an empty window in the middle of a restore
        ring.lane_table[:, LANE_HEAD] = checked["heads"] + shift
        ring.lane_table[:, LANE_BASE] = checked["bases"] + shift
        ring.stamps[:] = new_stamps
    if durable_file:
        try:
            durable.flush(ring, seg, deadline.left())  # the restored rows, durable
        except LockTimeout as exc:
            exc.args = (f"{exc.args[0]} (the rows were restored; the flush that puts them on the disk did not "
                        "finish: call flush())",)
            raise
