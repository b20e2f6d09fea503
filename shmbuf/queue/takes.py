"""Which rows a queue's take gets (part of :mod:`shmbuf.queue.protocol`, step 1 of a
take): rows given back first, oldest first; then per lane the rows from ``next`` up to
the first row a live writer still holds (rows of writers that died are skipped), merged
across lanes by the time their writes began, each lane's share a prefix of its rows.
:func:`claim` and :func:`skipped` work on a copy of the queue's words
(:class:`~shmbuf.queue.protocol.Words`) that the caller commits. Also here: the rows a take
delivered and its handle keeps (:class:`Kept`), the rows a give-back holds
(:func:`waiting`), the hidden field of a write (:func:`stamp`), and the message of a
write that found no room (:func:`full`)."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from shmbuf.core import gather, pool
from shmbuf.core.layout import LANE_BASE, LANE_HEAD, published
from shmbuf.core.read import Sampler

FIELD = "_queued"
"""The hidden field of a queue's rows: ``time.monotonic_ns()`` when their write began
(CLOCK_MONOTONIC: one clock for every process of a machine)."""
HEAD_WORDS, WIDTH = 8, 8  # the queue's head words; words per take entry
H_TAKEN, H_RETURNED, H_TAKES, H_SKIPPED, H_TAKE_WAIT, H_WRITE_WAIT, H_STALE = range(7)
E_STATE, E_PID, E_CTIME, E_LANE, E_START, E_COUNT, E_TIME, E_TOKEN = range(8)
FREE, TAKING, RETURNED = 0, 1, 2


def backoff(delay: float) -> float:
    """Sleep ``delay``; the next one (a queue's waits for rows and for room)."""
    time.sleep(delay)
    return min(max(2 * delay, 50e-6), 2e-3)


def words(lanes: int) -> int:
    """Words of a queue's head, next and take table (of ``64 + 8 * lanes`` entries)."""
    return HEAD_WORDS + lanes + WIDTH * (64 + 8 * lanes)


def usable(ring: Any, lane: int, seq: np.ndarray, skip: tuple[str, int, int] | None) -> tuple[np.ndarray, np.ndarray]:
    """Which rows ``seq`` of ``lane`` are published, and which of those a take with
    ``skip`` delivers: ``skip=(field, bound, newest)`` passes over the rows whose
    ``field`` is below ``bound`` (a take's ``max_staleness``: they are counted as stale
    and never delivered). The values are read raw: rows not yet taken never change."""
    slots = lane * ring.lane_capacity + seq % ring.lane_capacity
    pub = ring.stamps[slots] == published(seq)
    return pub, pub if skip is None else pub & (ring.arrays[skip[0]][slots] >= skip[1])


def _choose(ring: Any, s: Any, n: int, skip: tuple[str, int, int] | None) -> tuple[Any, Any, Any, Any, int]:
    """The rows a take of ``n`` would claim now, unclaimed: the given-back ranges' plan,
    the stale rows passed over with each, the fresh rows' plan, the lanes whose first
    rows are dead writers' (see :func:`fresh`), and how many rows are missing."""
    t = s.table
    plan: list[tuple[int, int, int, int, np.ndarray]] = []  # (entry or -1, lane, start, end, rows)
    want = n
    stale: list[int] = []  # per given-back range taken: its stale rows
    back = np.flatnonzero(t[:, E_STATE] == RETURNED)
    for e in back[np.lexsort((t[back, E_START], t[back, E_LANE], t[back, E_TIME]))].tolist():
        if want == 0:
            break
        lane, start, count = (int(x) for x in t[e, [E_LANE, E_START, E_COUNT]])
        seq = np.arange(start, start + count)
        pub, ok = usable(ring, lane, seq, skip)
        rows = seq[ok]
        end = start + count if len(rows) <= want else int(rows[want - 1]) + 1
        plan.append((e, lane, start, end, rows[:want]))
        stale.append(int((pub & ~ok)[:end - start].sum()))  # (passed over with the range taken)
        want -= len(rows[:want])
    fresh_, lead = fresh(ring, s, want, skip) if want else ([], {})
    return plan, stale, fresh_, lead, want - sum(len(p[4]) for p in fresh_)


def _ordered(ring: Any, *parts: Any) -> tuple[np.ndarray, np.ndarray]:
    """The lanes and sequence numbers of the plans ``parts`` in the order a take delivers
    them: given back first, then the fresh rows, each oldest first."""
    lc, lanes, seqs = ring.lane_capacity, [], []
    for part in parts:
        lane = np.concatenate([np.full(len(p[4]), p[1], np.int64) for p in part] or [np.zeros(0, np.int64)])
        seq = np.concatenate([p[4] for p in part] or [np.zeros(0, np.int64)])
        order = np.lexsort((seq, lane, ring.arrays[FIELD][lane * lc + seq % lc]))
        lanes.append(lane[order])
        seqs.append(seq[order])
    return np.concatenate(lanes), np.concatenate(seqs)


def claim(ring: Any, s: Any, n: int, partial: bool, pid: int, ctime: float,
           token: int, skip: tuple[str, int, int] | None = None, fit: Any = None) -> tuple[np.ndarray, np.ndarray] | None:
    """Choose and claim the rows of a take in ``s``; None if there are not enough
    yet (then only the rows of dead writers, and with ``skip`` the stale rows, at the
    front of lanes are skipped). ``fit(lanes, seqs, n)``: of the rows a take would claim,
    in order (more than ``n`` if there are), how many it takes (a token budget's, at
    most ``n``; whole writes: at least the first, whole) and whether that completes it;
    checked again on the rows chosen (writers publish without the lock: rows published
    since the first look must not pass the budget)."""
    if fit is not None:
        lanes, seqs = candidates(ring, s, n + ring.lane_capacity, skip)  # (past n: a write's rows to the end)
        if len(seqs):
            k, filled = fit(lanes, seqs, n)
            if filled:
                n, partial = k, True
    chosen = _choose(ring, s, n, skip)
    while fit is not None:
        lanes, seqs = _ordered(ring, chosen[0], chosen[2])
        k = fit(lanes, seqs, n)[0] if len(seqs) else len(seqs)
        if k >= len(seqs):
            break
        n, partial = k, True  # (fewer: n only ever goes down)
        chosen = _choose(ring, s, n, skip)
    plan, stale, fresh_, lead, missing = chosen
    t = s.table
    lc = ring.lane_capacity
    got = n - missing
    if got == 0 or (got < n and not partial):
        for (e, lane, start, end, rows), k in zip(plan, stale):  # given-back ranges of stale rows: passed over
            if k and not len(rows):
                t[e, E_STATE] = FREE
                s.head[H_STALE] += k
        for lane, to in lead.items():  # only skip the rows of dead writers (and stale rows) at the front
            skipped(ring, s, lane, to, skip)
        return None
    s.head[H_STALE] += sum(stale)
    between = []  # (lane, first row, rows) of our entries with rows passed over inside them
    for e, lane, start, end, rows in plan + fresh_:
        if e >= 0:  # a given-back range: its rows up to end are used up by this take
            rest = int(t[e, E_START] + t[e, E_COUNT]) - end
            if rest:
                t[e, E_START], t[e, E_COUNT] = end, rest
            else:
                t[e, E_STATE] = FREE
        if not len(rows):
            continue
        first, last = int(rows[0]), int(rows[-1])  # our entry: the rows we deliver, and those between
        free = np.flatnonzero(t[:, E_STATE] == FREE)
        if not len(free):
            raise RuntimeError(f"more than {len(t)} takes are in flight at once on this queue; "
                               "use fewer taker threads/processes")
        e = int(free[0])
        t[e, E_LANE], t[e, E_START], t[e, E_COUNT] = lane, first, last + 1 - first
        t[e, E_TIME] = int(ring.arrays[FIELD][lane * lc + first % lc])
        t[e, E_PID], t[e, E_TOKEN] = pid, token
        s.table_f[e, E_CTIME] = ctime
        t[e, E_STATE] = TAKING
        if last + 1 - first > len(rows):
            between.append((lane, first, rows))
    for _, lane, _, end, rows in fresh_:
        skipped(ring, s, lane, end, skip, len(rows))
    for lane, first, rows in between:  # (last: what counted them saw them published)
        unpublish(ring, lane, np.arange(first, int(rows[-1]) + 1), rows)
    return _ordered(ring, plan, fresh_)


def unpublish(ring: Any, lane: int, seq: np.ndarray, rows: np.ndarray) -> None:
    """Unpublish the rows ``seq`` of ``lane`` but ``rows``: the stale rows a take passed
    over between the rows it claims (stamp 0, as a dead writer leaves its rows; rows of
    writers that died there stay unpublished). Should its entry be given back, no later
    take delivers them nor does a snapshot keep them, and they are counted as stale only
    once, by the take that passed them over."""
    seq = np.setdiff1d(seq, rows)
    ring.stamps[lane * ring.lane_capacity + seq % ring.lane_capacity] = 0


def waiting(ring: Any, t: np.ndarray, which: Any) -> int:
    """How many rows the entries ``which`` of the take table ``t`` hold that a take may
    still deliver: their published rows (a given-back range may hold rows of writers
    that died and stale rows passed over, unpublished). Entries that cannot be right
    (a table read without the lock) count none."""
    lanes, n = len(ring.lane_table), 0
    for e in np.asarray(which, np.int64).tolist():
        lane, start, count = (int(x) for x in t[e, [E_LANE, E_START, E_COUNT]])
        if 0 <= lane < lanes and 0 <= count <= ring.lane_capacity:
            n += int(usable(ring, lane, np.arange(start, start + count), None)[0].sum())
    return n


def skipped(ring: Any, s: Any, lane: int, to: int, skip: tuple[str, int, int] | None, taken: int = 0) -> None:
    """Move ``lane``'s ``next`` to ``to``, counting the rows passed over that a take did
    not claim (``taken`` of them were): stale rows (published, below ``skip``'s bound)
    and dead writers' rows (unpublished)."""
    seq = np.arange(int(s.next[lane]), to)
    pub, ok = usable(ring, lane, seq, skip)
    stale = int((pub & ~ok).sum())
    s.head[H_STALE] += stale
    s.head[H_SKIPPED] += len(seq) - taken - stale
    s.next[lane] = to


def fresh(ring: Any, s: Any, want: int,
          skip: tuple[str, int, int] | None = None) -> tuple[list[tuple[int, int, int, int, np.ndarray]], dict[int, int]]:
    """The plan of up to ``want`` rows not yet claimed: per lane ``(-1, lane, next,
    end, rows)``, oldest first across lanes (see the module); and per lane whose
    first rows are dead writers' rows, the first row after them."""
    lt, lc = ring.lane_table, ring.lane_capacity
    heads = lt[:, LANE_HEAD].copy()
    nxt = np.clip(s.next, lt[:, LANE_BASE], heads)
    s.next[:] = nxt
    lanes, seqs, settled = [], [], {}
    for lane in np.flatnonzero(heads > nxt).tolist():
        seq = np.arange(nxt[lane], heads[lane])
        pub, ok = usable(ring, lane, seq, skip)
        if not pub.all():  # stop at the first row a live writer holds; skip the dead ones
            held = ring.held(np.full(len(seq), lane), seq)
            pub, ok = usable(ring, lane, seq, skip)  # (again, after held: see Claims.held)
            live = held & ~pub
            if live.any():
                stop = int(np.argmax(live))
                seq, pub, ok = seq[:stop], pub[:stop], ok[:stop]
        pub = ok  # (from here: the rows to deliver; stale ones are passed over like dead ones)
        settled[lane] = (seq, pub)
        lanes.append(np.full(int(pub.sum()), lane, np.int64))
        seqs.append(seq[pub])
    plan: list[tuple[int, int, int, int, np.ndarray]] = []
    lead = {}
    for lane, (seq, pub) in settled.items():
        to = int(seq[np.argmax(pub)]) if pub.any() else (int(seq[-1]) + 1 if len(seq) else int(nxt[lane]))
        if to > nxt[lane]:
            lead[lane] = to
    if not settled:
        return plan, lead
    lane_of, seq_of = np.concatenate(lanes), np.concatenate(seqs)
    when = ring.arrays[FIELD][lane_of * lc + seq_of % lc]
    chosen = lane_of[np.lexsort((seq_of, lane_of, when))[:want]]
    per_lane = np.bincount(chosen, minlength=ring.lanes)
    for lane, (seq, pub) in settled.items():
        k = int(per_lane[lane])
        rows = seq[pub][:k]
        # end: past the last row chosen and the dead rows after it (all of them if none chosen)
        later = seq[pub][k:]
        end = int(later[0]) if len(later) else (int(seq[-1]) + 1 if len(seq) else int(nxt[lane]))
        if end > nxt[lane]:
            plan.append((-1, lane, int(nxt[lane]), end, rows))
    return plan, lead


def delivered(s: Any, lc: int, stamps: np.ndarray) -> np.ndarray:
    """Which of ``stamps`` (one per slot, as a snapshot keeps them: a published row's
    stamp, or 0) name rows a take already delivered, by the words ``s``: below their
    lane's ``next`` and in no given-back range. A snapshot leaves them out, so a restore
    delivers each row not yet taken once, and no other."""
    lanes = len(s.next)
    lane = np.arange(len(stamps)) // lc
    seq = stamps // 2 - 1
    out = (stamps > 0) & (seq < s.next[lane])
    t = s.table
    for e in np.flatnonzero(t[:, E_STATE] == RETURNED).tolist():
        ln, start, count = (int(x) for x in t[e, [E_LANE, E_START, E_COUNT]])
        if 0 <= ln < lanes:
            out[(lane == ln) & (seq >= start) & (seq < start + count)] = False
    return out


Rows = tuple  # (batch: dict of arrays, lanes, sequence numbers): rows a take delivered


def stamp(data: Any, single: bool) -> dict[str, Any]:
    """``data`` with the hidden field: the time this write began."""
    data = dict(data)
    data.pop(FIELD, None)
    now = time.monotonic_ns()
    if single:
        data[FIELD] = now
    else:
        rows = next(iter(data.values()), None)
        data[FIELD] = np.full(len(rows) if hasattr(rows, "__len__") else 1, now, np.int64)
    return data


def full(ring: Any, t: np.ndarray, lane: int, n: int, timeout: float, why: Any = ()) -> str:
    """The message of a write of ``n`` rows that did not fit into ``lane`` (``t``: the
    take table): who holds its oldest rows. ``why``: the ``QueueFull``'s arguments
    beyond the lane (a queue with ragged fields: its room in bytes)."""
    lt = ring.lane_table
    waiting = int(lt[lane, LANE_HEAD] - lt[lane, LANE_BASE])
    takers = sorted({int(p) for p in t[(t[:, E_STATE] == TAKING) & (t[:, E_LANE] == lane), E_PID]})
    who = (f"live take(s) of process(es) {takers} hold its oldest rows" if takers else
           "no take is in flight: nobody took rows from it")
    bytes_ = f" ({why[1]})" if len(why) > 1 else ""
    return (f"the queue is full{bytes_}: {n} row(s) did not fit into lane {lane} within {timeout:g} s "
            f"(it holds {waiting} rows not yet delivered, of {ring.lane_capacity}; {who}). Take rows faster, "
            f"create the queue with a larger {'arena=' if bytes_ else 'capacity'}, or pass a larger timeout=")


class Kept:
    """Rows delivered to a handle's takes that no take returned yet (a Ctrl-C landed
    after their delivery), oldest first: the next take returns them first."""

    def __init__(self) -> None:
        self.parts: list[Rows] = []

    def __len__(self) -> int:
        return sum(len(p[1]) for p in self.parts)

    def back(self, *parts: Rows | None) -> None:
        """Keep ``parts`` (None: none), before the rows kept already."""
        self.parts[:0] = [p for p in parts if p is not None]

    def pass_over(self, skip: tuple[str, int, int], edit: Callable[[], Any]) -> None:
        """Drop the kept rows a take with ``skip`` would pass over (their ``field`` below
        its bound: stale since they were kept), counted as stale rows instead of taken
        ones in the change ``edit()`` commits (a stale row is never delivered)."""
        rows = merged(*self.parts)
        ok = rows[0][skip[0]] >= skip[1]
        stale = len(ok) - int(ok.sum())
        if stale:
            with edit() as s:
                s.head[H_TAKEN] -= stale
                s.head[H_STALE] += stale
            self.parts[:] = [({k: a[ok] for k, a in rows[0].items()}, rows[1][ok], rows[2][ok])] if ok.any() else []

    def out(self, n: int) -> Rows:
        """Up to ``n`` rows (there are some), taken out, oldest first."""
        rows = merged(*self.parts)
        rest = [({k: a[n:] for k, a in rows[0].items()}, rows[1][n:], rows[2][n:])] if len(rows[1]) > n else []
        out = {k: a[:n] for k, a in rows[0].items()}, rows[1][:n], rows[2][:n]
        self.parts[:] = rest  # (last, with no call after it: an interrupt leaves them whole, or out returned)
        return out


def merged(*parts: Rows) -> Rows:
    """The rows of ``parts`` in one batch, in their order but for each lane's rows,
    which take that lane's places in the batch in the order of their sequence numbers
    (rows given back by a taker that died may be older than rows a Ctrl-C kept)."""
    if len(parts) == 1:
        return parts[0]
    batch = {k: _joined([p[0][k] for p in parts]) for k in parts[0][0]}
    lanes, seqs = (np.concatenate([p[i] for p in parts]) for i in (1, 2))
    order = np.arange(len(lanes))
    for lane in np.unique(lanes).tolist():
        at = np.flatnonzero(lanes == lane)
        order[at] = at[np.argsort(seqs[at], kind="stable")]
    return {k: a[order] for k, a in batch.items()}, lanes[order], seqs[order]


def _joined(arrays: list[Any]) -> Any:
    """The rows of ``arrays`` one after the other (arrays, or a ragged field's
    :class:`~shmbuf.ragged.jagged.Jagged`, which joins its own)."""
    first = arrays[0]
    return np.concatenate(arrays) if isinstance(first, np.ndarray) else type(first).concatenate(arrays)


def candidates(ring: Any, s: Any, n: int, skip: tuple[str, int, int] | None) -> tuple[np.ndarray, np.ndarray]:
    """The rows a take of ``n`` would claim now, in the order :func:`claim` delivers them
    (given back first, then the fresh rows oldest first): a take with a budget (``fit``)
    sees their lengths before it claims (changes nothing but a lane's ``next`` clipped
    into its window, as :func:`fresh` does)."""
    plan, _, fresh_, _, _ = _choose(ring, s, n, skip)
    return _ordered(ring, plan, fresh_)


class Taken(Sampler):
    """The rows a take claimed (``lanes``, ``seqs``), position by position: a failed
    check copies the same row again."""

    what = "taken rows"
    hint = (": their stamps changed while they were claimed (the segment was written by something that "
            "does not follow the protocol)")

    def __init__(self, ring: Any, lanes: np.ndarray, seqs: np.ndarray) -> None:
        self.ring, self.lanes, self.seqs = ring, lanes, seqs
        self.fields = ring.layout.fields

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return pool.batch([f for f in self.fields if f.name != FIELD], m)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        return self.lanes[todo], self.seqs[todo]

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        return gather.copy_windows(self.ring, drawn[0], drawn[1], 1, None, [out.get(f.name) for f in self.fields])
