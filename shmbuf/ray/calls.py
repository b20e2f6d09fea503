"""Calls to the shards of a :class:`~shmbuf.ray.ShardedBuffer`: a batch planned across
the shards and gathered from their answers, and the shards' health (a shard that does
not answer is marked down, pinged, and taken back when it answers). A part of
``ShardedBuffer``."""

from __future__ import annotations

import time
import warnings
from typing import Any, Mapping

import numpy as np

from shmbuf.core.batch import count
from shmbuf.priority.trees import check_values
from shmbuf.ragged.batches import budget as fit_budget
from shmbuf.ragged.jagged import Jagged


PING_EVERY = 1.0
"""Seconds between two pings of a shard that is down."""


class ShardWarning(RuntimeWarning):
    """A shard was dropped from sampling (dead, or too slow to answer), or came back."""


class ShardsUnavailable(TimeoutError):
    """No shard (or not enough of them) answered in time to make the whole batch."""


def ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("shmbuf.ray needs Ray: pip install ray (or, from a clone of shmbuf, pip install '.[ray]')") from None
    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialised in this process: call ray.init() (ray.init(address='auto') "
                           "to join a running cluster) before using a ShardedBuffer")
    return ray


def cause(exc: BaseException) -> BaseException:
    """A Ray task's own exception as it was raised in the task (else ``exc``)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


class Shard:
    """The learner's view of one shard: where it is and the figures of its last answer."""

    __slots__ = ("index", "node", "segment", "actor", "size", "mass", "low", "capacity", "alpha", "lengths", "queue",
                 "up", "ping", "ping_at", "info_ref")

    def __init__(self, index: int, node: str | None, segment: str, actor: Any) -> None:
        self.index, self.node, self.segment, self.actor = index, node, segment, actor
        self.size, self.mass, self.low = 0, 0.0, 0.0
        self.capacity: int | None = None  # (None: it has not answered yet)
        self.alpha: float | None = None  # its priority exponent (None: not prioritized)
        self.lengths: dict[str, str] | None = None  # what a token budget may count: a ragged field of each
        self.queue: bool | None = None  # whether it is a queue (taken from)
        self.up = True
        self.ping: Any = None  # while down: the pending info() call that tells it is back
        self.ping_at = 0.0
        self.info_ref: Any = None  # a pending info() of a shard the last draw gave no rows

    def take(self, info: Mapping[str, Any]) -> None:
        self.size, self.mass, self.low = info["size"], info["mass"], info["low"]
        self.capacity, self.alpha, self.lengths = info["capacity"], info.get("alpha"), info.get("lengths")
        self.queue = info.get("queue")
        self.node, self.segment = info["node"], info.get("segment", self.segment)


def shares(w: np.ndarray) -> np.ndarray | None:
    """Each shard's share of a draw, ``w / w.sum()`` (``w``: the shards' sizes or priority
    masses, each finite and >= 0), or None if all are 0. Scaled by the largest first: each
    shard's mass is finite (its leaves are bounded so that it is), but the sum of several
    near that bound is not (``inf``: every share would be 0).

    Examples:
        >>> shares(np.array([1.5e308, 1.5e308, 0.0])).tolist()
        [0.5, 0.5, 0.0]
    """
    top = float(w.max()) if len(w) else 0.0
    if not top > 0:
        return None
    w = w / top
    return w / w.sum()


def split_updates(shards: list[Shard], idx: np.ndarray, p: np.ndarray) -> list[tuple[Shard, np.ndarray, np.ndarray]]:
    """Priority updates (``idx``: shard, slot, row; ``p``: finite and > 0) split by shard:
    (shard, its rows' (slot, row), their priorities) for each shard that is up and has
    rows here. Every row is checked first against the bounds of its own shard (its
    slots below its capacity; ``p**a`` in ``(0, largest_leaf(capacity)]`` with its
    exponent ``a``), the rows of shards down too: a ValueError here means that no shard
    was asked to change anything. (A shard that has not answered yet, ``capacity``
    None, has its rows checked by itself only: ``ShardCalls._update`` asks such shards
    that are up for their figures first, so those left are down, their rows not sent.)"""
    out = []
    for s in shards:
        mine = idx[:, 0] == s.index
        if not mine.any():
            continue
        rows, mine_p = idx[mine, 1:].astype(np.int64), p[mine]
        if s.capacity is not None:
            bad = (rows[:, 0] < 0) | (rows[:, 0] >= s.capacity)
            if bad.any():
                raise ValueError(f"index: the slots of shard {s.index} must be in [0, {s.capacity}) (its capacity), "
                                 f"got {np.unique(rows[bad, 0])[:5].tolist()}: pass the index as "
                                 "ShardedBuffer.sample returned it; no priority was set")
            check_values(mine_p, None, f"update_priorities (shard {s.index}; no priority was set)", s.alpha,
                         s.capacity)
        if s.up:
            out.append((s, rows, mine_p))
    return out


def check_length(live: list[Shard], length: str | None) -> None:
    """ValueError unless a token budget's ``length`` (None: no budget) is a ragged field
        or length of the shards (as the last of them to answer reported it): before
        anything is drawn."""
    if length is None:
        return
    known = next((s.lengths for s in reversed(live) if s.lengths is not None), None)
    if known is None or length in known:
        return  # (no shard has answered yet: the shards check it)
    if not known:
        raise ValueError("max_tokens= and length= are for a buffer with ragged fields (a schema with (None, ...) "
                         "or ('R', ...) shapes, and arena=); this one has none")
    raise ValueError(f"length={length!r} names no ragged field or length of this buffer; it has {sorted(known)}")


def counted(shards: list[Shard], length: str) -> str:
    """The ragged field whose lengths a budget of ``length`` counts, as a shard that has
    answered says (one has: its rows are there)."""
    return next(s.lengths[length] for s in shards if s.lengths and length in s.lengths)


class Plan:
    """A batch asked for: its calls in flight, per shard."""

    __slots__ = ("key", "n", "parts", "sizes")

    def __init__(self, key: tuple, n: int, parts: list[tuple[Shard, Any, int]], sizes: Any = None) -> None:
        self.key, self.n, self.parts, self.sizes = key, n, parts, sizes


class ShardCalls:
    """The batch plans and the health checks of ``ShardedBuffer``."""

    _shards: list[Shard]

    def _take(self, method: str, n: int, args: tuple, kwargs: dict[str, Any], prefetch: int,
              timeout: float | None, beta: float | None = None, sizes: Any = None) -> dict[str, np.ndarray]:
        timeout = self._t(timeout)
        prefetch = count(prefetch, "prefetch")
        key = (method, n, args, sorted(kwargs.items()))
        if self._inflight and self._inflight[0].key != key:
            self._inflight.clear()  # asked for with other arguments: dropped
        self._poll()
        deadline = time.monotonic() + timeout
        plan = self._inflight.popleft() if self._inflight else self._launch(key, timeout, sizes=sizes)
        while len(self._inflight) < prefetch:
            self._inflight.append(self._launch(key, timeout, sizes=sizes))
        return self._finish(plan, deadline, timeout, beta)

    def _launch(self, key: tuple, timeout: float, n: int | None = None, sizes: Any = None) -> Plan:
        """Draw the per-shard counts of ``n`` rows (the key's) and ask the shards. Each
        gets 0.4 ``timeout`` for its own waits (a rate limit, torn-read retries): its
        timeout error is then the caller's, before the shard is taken for silent.
        ``sizes``: ``{shard index: rows}`` to split by instead of the shards' sizes
        (the rows of recent enough versions)."""
        method, n_key, args, kwargs = key
        n = n_key if n is None else n
        deadline = time.monotonic() + timeout
        live = [s for s in self._shards if s.up]
        if self._fresh:
            self._fresh = False
            self._refresh(live, (deadline - time.monotonic()) / 2)
            live = [s for s in self._shards if s.up]
        if not live:
            raise ShardsUnavailable(f"no shard of {self._name!r} is up ({self._describe()})")
        by_mass = self._prioritized and method == "sample"
        check_length(live, dict(kwargs).get("length"))
        if sizes is not None:
            live = [s for s in live if sizes.get(s.index, 0) > 0]
            if not live:
                raise ShardsUnavailable(f"no shard of {self._name!r} that is up holds rows of the versions asked "
                                        f"for ({self._describe()})")
        w = np.array([sizes[s.index] if sizes is not None else s.mass if by_mass else s.size for s in live],
                     np.float64)
        share = shares(w)
        if share is None:  # (the sizes known say empty: they may be old)
            wait = (deadline - time.monotonic()) / 2
            self._refresh(live, wait)
            live = [s for s in live if s.up]
            if not live:  # (every one dropped as it was asked: none to draw from, empty or not)
                raise ShardsUnavailable(f"no shard of {self._name!r} answered within {max(wait, 0.0):.2g} s, "
                                        f"asked for its size ({self._describe()})")
            share = shares(np.array([s.mass if by_mass else s.size for s in live], np.float64))
            if share is None:
                raise ValueError(f"cannot sample from an empty buffer: no shard of {self._name!r} holds rows "
                                 f"yet ({self._describe()})")
        counts = self._rng.multinomial(n, share)
        if n == 0:
            counts[0] = -1  # (one shard asked for no rows: the batch's fields, shapes and dtypes)
        ask = {**dict(kwargs), "timeout": 0.4 * timeout}
        cap = ask.pop("n", None)  # (a token budget's: n is the units drawn are tokens, cap the rows)
        parts = []
        for s, c in zip(live, counts):
            if c:
                c = max(int(c), 0)
                request = (method, cap, args, {**ask, "max_tokens": c}) if "length" in ask else (method, c, args, ask)
                parts.append((s, s.actor.sample.remote(request), c))
            elif s.info_ref is None:
                s.info_ref = s.actor.info.remote()  # (no rows asked: its size still gets fresher)
        return Plan(key, n, parts, sizes)

    def _finish(self, plan: Plan, deadline: float, timeout: float, beta: float | None) -> dict[str, np.ndarray]:
        """Wait for a plan's answers; draw again from the others the rows of shards that
        failed; assemble the batch."""
        ray = ray_module()
        got: list[tuple[Shard, dict[str, np.ndarray], int]] = []
        parts = plan.parts
        patience = time.monotonic() + timeout / 2  # a shard slower than this is dropped
        while parts:
            until = min(patience, deadline)
            try:  # the usual case, in one call: every shard answers
                answers = dict(zip([s.index for s, _, _ in parts],
                                   ray.get([r for _, r, _ in parts], timeout=max(0.0, until - time.monotonic()))))
            except Exception:  # (one by one, in what is left of the wait: who failed, and how)
                answers = self._gather([(s, r) for s, r, _ in parts], until - time.monotonic(),
                                       within=timeout / 2 if until == patience else timeout)
            missing = 0
            for s, _, c in parts:
                if s.index in answers:
                    batch, info = answers[s.index]
                    s.take(info)
                    got.append((s, batch, c))
                else:
                    missing += c
            if not missing:
                break
            if time.monotonic() >= deadline or not any(s.up for s in self._shards):
                raise ShardsUnavailable(
                    f"{missing} of {plan.n} rows could not be drawn within {timeout:g} s: "
                    f"{self._describe()}")
            parts = self._launch(plan.key, max(deadline - time.monotonic(), 1e-3), missing, plan.sizes).parts
            patience = deadline
        self._collect_infos()
        kwargs = dict(plan.key[3])
        length = kwargs.get("length")
        if length is None:
            return self._assemble(got, beta)
        return self._assemble(got, beta, (plan.n, counted(self._shards, length), kwargs.get("n")))

    def _assemble(self, got: list[tuple[Shard, dict[str, Any], int]], beta: float | None,
                  budget: tuple[int, str, int | None] | None = None) -> dict[str, Any]:
        """One batch of the shards' answers, rows in a random order (so any slice of
        it is a sample too). A ragged field's parts become one :class:`Jagged`.

        ``budget``: a token budget's ``(max_tokens, field, n)``: the batch is cut before
        the first row, in that random order, whose ``field`` would pass ``max_tokens``
        (at least one row), and at ``n`` rows if given, as one buffer's budget stops
        its draw."""
        sizes = [len(next(iter(batch.values()))) for _, batch, _ in got]
        total = sum(sizes)
        where = self._rng.permutation(total)  # (row j of the answers, end to end, goes to where[j])
        keep = total
        if budget is not None:
            tokens, field, cap = budget
            lengths = np.empty(total, np.int64)
            lengths[where] = np.concatenate([batch[field].lengths for _, batch, _ in got])
            keep = fit_budget(lengths, tokens)
            keep = keep if cap is None else min(keep, cap)
        first = got[0][1]
        out: dict[str, Any] = {k: np.empty((keep,) + v.shape[1:], v.dtype) for k, v in first.items()
                               if not isinstance(v, Jagged)}
        out["shard"] = np.empty(keep, np.int32)
        at = 0
        for (s, batch, _), c in zip(got, sizes):
            rows = where[at:at + c]
            at += c
            mine = rows < keep
            rows = rows[mine] if keep < total else rows
            for k, v in batch.items():
                if k in out:
                    out[k][rows] = v[mine] if keep < total else v
            out["shard"][rows] = s.index
        ragged = [k for k, v in first.items() if isinstance(v, Jagged)]
        if ragged:  # (the rows in the answers' order that go to places 0, 1, ...: one gather each)
            order = np.argsort(where)[:keep]
            for k in ragged:
                out[k] = Jagged.concatenate([batch[k] for _, batch, _ in got])[order]
        if beta is not None:  # weights over the whole cluster: its smallest p**a, not a shard's
            p = out.pop("p")
            lows = [s.low for s in self._shards if s.up and s.low > 0]
            low = min(lows + [float(p.min())]) if len(p) else 1.0
            out["weight"] = np.power(low / p, beta)
            out["index"] = np.concatenate([out["shard"][:, None].astype(np.int64), out["index"]], axis=1)
        return out

    # -- priorities ------------------------------------------------------------------

    def _update(self, idx: np.ndarray, p: np.ndarray, timeout: float) -> int:
        """``update_priorities`` of ``idx`` (shard, slot, row; shards in range) to ``p``
        (finite, > 0): every row checked against its shard's bounds before any shard is
        asked (:func:`split_updates`), then each shard's rows sent to it at once."""
        deadline = time.monotonic() + timeout
        unseen = [s for s in self._shards if s.up and s.capacity is None and (idx[:, 0] == s.index).any()]
        if unseen:  # (a copy unpickled in a task: their bounds first; one that does not answer is down)
            self._refresh(unseen, timeout / 2)
        calls = [(s, s.actor.update_priorities.remote(rows, q)) for s, rows, q in split_updates(self._shards, idx, p)]
        total = 0
        for i, (got, info) in self._gather(calls, deadline - time.monotonic()).items():
            self._shards[i].take(info)  # (the next draw counts on its new mass)
            total += got
        return total

    def _down(self, s: Shard, why: str) -> None:
        if s.up:
            s.up = False
            s.ping, s.ping_at = None, 0.0
            up = [t.index for t in self._shards if t.up]
            warnings.warn(ShardWarning(f"shard {s.index} of {self._name!r} (node {s.node}) {why}: dropped from "
                                       f"sampling until it answers again; sampling from shards {up}"))
            self._inflight.clear()  # (their counts counted on it)

    def _poll(self) -> None:
        """Without waiting: bring back the shards that answer a ping, ping the others."""
        ray = ray_module()
        now = time.monotonic()
        for s in self._shards:
            if s.up:
                continue
            if s.ping is not None:
                ready, _ = ray.wait([s.ping], timeout=0)
                if not ready:
                    continue
                try:
                    s.take(ray.get(s.ping))
                except ray.exceptions.RayError:
                    s.ping, s.ping_at = None, now + PING_EVERY
                    continue
                s.up, s.ping = True, None
                warnings.warn(ShardWarning(f"shard {s.index} of {self._name!r} (node {s.node}) is back with "
                                           f"{s.size} rows: sampling from it again"))
            elif now >= s.ping_at:
                s.ping = s.actor.info.remote()
        self._collect_infos()

    def _collect_infos(self) -> None:
        """The sizes asked of shards that got no rows in a draw, if they have answered."""
        ray = ray_module()
        for s in self._shards:
            if s.info_ref is not None and ray.wait([s.info_ref], timeout=0)[0]:
                try:
                    s.take(ray.get(s.info_ref))
                except ray.exceptions.RayError:
                    pass  # (a sample of it will say so)
                s.info_ref = None

    def _refresh(self, shards: list[Shard], seconds: float) -> list[tuple[str, bool]]:
        """Ask ``shards`` for their figures now (one round trip, up to ``seconds``; the
        others are dropped); returns the (kind, prioritized) of each that answered."""
        answers = self._gather([(s, s.actor.info.remote()) for s in shards], seconds)
        for i, info in answers.items():
            self._shards[i].take(info)
        return [(info["kind"], info["prioritized"]) for info in answers.values()]

    def _gather(self, calls: list[tuple[Shard, Any]], seconds: float,
                errors: dict[int, str] | None = None, within: float | None = None) -> dict[int, Any]:
        """The answers to ``calls`` (shard, pending call) given within ``seconds``, by
        shard index. A shard that failed (its actor died) or did not answer in time is
        dropped (the warning says it waited ``within`` seconds, default ``seconds``). A
        shard's own error (raised by its method: the caller's arguments, a timeout of
        its own) is raised here, or kept in ``errors`` if given."""
        ray = ray_module()
        refs = [r for _, r in calls]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=max(0.0, seconds))[0]) if refs else set()
        out = {}
        for s, ref in calls:
            try:
                if ref not in ready:
                    raise TimeoutError(f"did not answer within {max(0.0, seconds if within is None else within):.2g} s")
                out[s.index] = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                if errors is None:
                    raise cause(exc) from None
                errors[s.index] = str(cause(exc))
            except (ray.exceptions.RayError, TimeoutError) as exc:
                why = str(exc) if isinstance(exc, TimeoutError) else f"failed ({type(exc).__name__})"
                self._down(s, why)
                if errors is not None:
                    errors[s.index] = why
        return out

    def _describe(self) -> str:
        up = [s.index for s in self._shards if s.up]
        down = [s.index for s in self._shards if not s.up]
        return f"shards up: {up}, down: {down}"
