"""The versions and the queue of a :class:`~shmbuf.ray.ShardedBuffer`: the cluster's
version bound (``max_staleness=`` over every shard), and ``take`` from shards that are
queues (``mode="queue"``), token budgets included. A part of ``ShardedBuffer``.

A take asks the shards that hold rows for their parts of ``n`` (and of ``max_tokens``)
at once, each a ``take(partial=True)`` of its own queue, and joins their rows in the
shards' order (each shard's in its own order). Rows a shard took are never lost by the
caller: those past the take's ``n`` or budget, and those of an answer that came after
the take stopped waiting, are *held* by this handle and returned first by its next take.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shmbuf.core import validate
from shmbuf.core.batch import count
from shmbuf.core.read import SampleTimeout
from shmbuf.ragged.batches import budget as fit_budget
from shmbuf.ragged.jagged import Jagged
from shmbuf.ray.calls import Shard, cause, check_length, counted, ray_module, shares
from shmbuf.versions.bound import check_version

WAIT = 0.25
"""Seconds a shard waits for a row in a take's round when none of the shards was known
to hold one (the take asks again after, until its own timeout)."""


class Takes:
    """``take`` and the cluster's version bound (see :class:`ShardedBuffer`)."""

    _shards: list[Shard]
    _held: list[tuple[Shard, dict[str, Any]]]  # rows taken from shards, not returned yet (oldest first)
    _late: list[tuple[Shard, Any]]  # take calls a take stopped waiting for: their rows are held when they come

    def take(self, n: int, *, partial: bool = False, timeout: float | None = None, max_tokens: int | None = None,
             length: str | None = None, max_staleness: int | None = None, min_version: int | None = None,
             version: int | None = None) -> dict[str, Any]:
        """Take ``n`` rows from shards that are queues (``create(..., mode="queue")``):
        each row is delivered once, to one take of any handle, as from one queue. The
        shards that hold rows (as their last answers said) are asked for their parts of
        ``n``, split multinomially on how many rows each holds; their rows are joined in
        the shards' order (``shard`` says whose). ``partial=True`` returns after the first
        round that got any row; else the take asks again until it has ``n`` rows or its
        budget is filled, up to ``timeout`` (``SampleTimeout``).

        ``max_tokens=T`` with ``length="R"``: at most ``T`` values of that length in all
        (at least one row), ``T`` split as ``n`` is; the rows are cut before the first
        that would pass ``T``, as one queue's budget does. ``max_staleness=k`` (or
        ``min_version=``) is the cluster's bound: ``k`` versions from ``version``, else
        from the newest row of any shard; each shard passes over its rows below it.

        Rows a shard delivered that this take does not return (past ``n`` or the
        budget, or an answer that came after it stopped waiting, or the rows of a take
        that timed out) are held by this handle and returned first by its next take
        (those the next take's version bound passes over are dropped).
        """
        n = count(n, "n", 1)
        partial = validate.flag(partial, "partial")
        timeout = self._t(timeout)
        if (max_tokens is None) != (length is None) or not (length is None or isinstance(length, str)):
            raise ValueError("a token budget takes both max_tokens= and length= (the name of the ragged field "
                             f"or length it counts), got max_tokens={max_tokens!r}, length={length!r}")
        tokens = None if max_tokens is None else count(max_tokens, "max_tokens", 1)
        deadline = time.monotonic() + timeout
        self._poll()
        if self._fresh:
            self._fresh = False
            self._refresh([s for s in self._shards if s.up], timeout / 2)
        check_length([s for s in self._shards if s.up], length)
        if any(s.queue is False for s in self._shards):
            raise ValueError("take() is for a queue: create the ShardedBuffer with mode='queue' (a replay buffer "
                             "is sampled, with sample())")
        ask: dict[str, Any] = {} if tokens is None else {"length": length}
        self._land(0.0)
        if not (max_staleness is None and min_version is None and version is None):
            held = [int(b["version"].max()) for _, b in self._held if len(b.get("version", ()))]
            ask["min_version"] = self._bound(min_version, max_staleness, version, timeout, held)
        got = [(s, b) for s, b in ((s, _since(b, ask.get("min_version"))) for s, b in self._held) if b is not None]
        self._held = []
        try:
            nothing = False  # (the last round got no row: the next one waits for one)
            while True:
                field = counted(self._shards, length) if tokens is not None and got else ""
                out, rest, filled = _cut(got, n, tokens, field)
                if filled or (partial and out is not None):
                    got = rest
                    return out
                if time.monotonic() >= deadline:
                    raise SampleTimeout(f"could not take {n} row(s) within {timeout:g} s from the shards of "
                                        f"{self._name!r} ({sum(_rows(b) for _, b in got)} taken, held for the "
                                        f"next take; {self._describe()})")
                before, left = len(got), deadline - time.monotonic()
                rows, used = sum(_rows(b) for _, b in got), 0 if tokens is None else _tokens(got, field)
                self._round(got, n - rows, None if tokens is None else tokens - used, ask,
                            min(0.4 * left, WAIT) if nothing else 0.0, left, timeout / 2)
                nothing = len(got) == before
        finally:  # (what it took and does not return, an error or a Ctrl-C included: held)
            self._held = got + self._held

    def _round(self, got: list[tuple[Shard, dict[str, Any]]], rows: int, tokens: int | None, ask: dict[str, Any],
               wait: float, left: float, patience: float) -> None:
        """One round of a take, its rows added to ``got``: each shard known to hold rows
        asked for its part of ``rows`` (or of ``tokens``) without waiting; or, when
        ``wait`` > 0 or none is known to hold any, each shard up asked for them all,
        waiting up to ``wait`` s for a row. A call not answered within ``left`` s goes to
        ``_late``; its shard, if that was all of ``patience`` (half the take's timeout), is
        dropped."""
        ray = ray_module()
        live = [s for s in self._shards if s.up]
        if not live:
            return
        share = shares(np.array([s.size for s in live], np.float64)) if wait == 0.0 else None
        if share is None:
            parts, wait = [(s, rows, tokens) for s in live], max(wait, 1e-3)
        else:
            counts = self._rng.multinomial(rows if tokens is None else tokens, share)
            parts = [(s, rows, int(c)) if tokens is not None else (s, int(c), None)
                     for s, c in zip(live, counts) if c]
        calls = [(s, s.actor.take.remote((m, {**ask, "timeout": wait, **({} if t is None else {"max_tokens": t})})))
                 for s, m, t in parts]
        refs = [r for _, r in calls]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=max(0.0, min(left, patience)))[0])
        error = None
        for s, ref in calls:
            if ref not in ready:  # (its rows are held when it answers; silent for all of patience: dropped)
                self._late.append((s, ref))
                if left >= patience:
                    self._down(s, f"did not answer a take within {patience:.2g} s")
                continue
            try:
                got += self._answer(s, ref)
            except Exception as exc:  # (a shard's own error: raised once every answer's rows are kept)
                error = error or exc
        if error is not None:
            raise error

    def _answer(self, s: Shard, ref: Any) -> list[tuple[Shard, dict[str, Any]]]:
        """A shard's answer to a take: its rows (none if it had none), its figures taken."""
        ray = ray_module()
        try:
            batch, info = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            raise cause(exc) from None
        except ray.exceptions.RayError as exc:  # (its actor died: the rows it had not delivered are still its queue's)
            self._down(s, f"failed ({type(exc).__name__})")
            return []
        s.take(info)
        return [] if batch is None else [(s, batch)]

    def _land(self, seconds: float) -> None:
        """The answers of ``_late`` calls that came: their rows held (after those held)."""
        ray = ray_module()
        if not self._late:
            return
        ready = set(ray.wait([r for _, r in self._late], num_returns=len(self._late), timeout=seconds)[0])
        late, self._late = self._late, []
        for s, ref in late:
            if ref in ready:
                self._held += self._answer(s, ref)
            else:
                self._late.append((s, ref))

    # -- versions --------------------------------------------------------------------

    def _bound(self, min_version: Any, max_staleness: Any, version: Any, timeout: float | None,
               held: list[int] = []) -> int:
        """The cluster's lowest version of a sample or take by version (``held``: the
        newest versions of the rows a take holds, counted with the shards')."""
        if min_version is not None and (max_staleness is not None or version is not None):
            raise ValueError("pass min_version= alone, or max_staleness= (with version=, if no Weights is bound)")
        if min_version is not None:
            return check_version(min_version, "min_version")
        k = check_version(max_staleness, "max_staleness")
        newest = check_version(version) if version is not None else max(
            [v for v, _ in self._versions(None, timeout).values() if v is not None] + held, default=0)
        return max(newest - k, 0)

    def _versions(self, bound: int | None, timeout: float | None) -> dict[int, tuple[Any, int]]:
        """Every shard that is up and answers in time: its newest version and rows of version >= bound."""
        ray = ray_module()
        live = [s for s in self._shards if s.up]
        refs = [s.actor.versions.remote(bound) for s in live]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self._t(timeout) / 2)
        try:
            return {s.index: ray.get(r) for s, r in zip(live, refs) if r in ready}
        except ray.exceptions.RayTaskError as exc:
            raise cause(exc) from None


def _rows(batch: dict[str, Any]) -> int:
    return len(next(iter(batch.values())))


def _tokens(got: list[tuple[Shard, dict[str, Any]]], field: str) -> int:
    return sum(int(b[field].values.shape[0]) for _, b in got)


def _since(batch: dict[str, Any], bound: int | None) -> dict[str, Any] | None:
    """The rows of a held ``batch`` of version ``>= bound`` (None: it has none)."""
    if bound is None or "version" not in batch:
        return batch
    keep = batch["version"] >= bound
    return None if not keep.any() else batch if keep.all() else {k: v[keep] for k, v in batch.items()}


def _cut(got: list[tuple[Shard, dict[str, Any]]], n: int, tokens: int | None,
         field: str) -> tuple[dict[str, Any] | None, list[tuple[Shard, dict[str, Any]]], bool]:
    """The rows of ``got`` a take returns, joined (None: there are none), the rows past
    them, and whether they complete the take: ``n`` rows, or the budget of ``tokens``
    values of ``field`` filled (the next row would pass it, or they reach it), at least
    one row."""
    total = sum(_rows(b) for _, b in got)
    if not total:
        return None, [], False
    k, filled = min(n, total), total >= n
    if tokens is not None:
        cum = np.cumsum(np.concatenate([b[field].lengths for _, b in got]))
        fits = fit_budget(np.diff(cum, prepend=0), tokens)
        filled = filled or fits < total or int(cum[fits - 1]) >= tokens
        k = min(k, fits)
    out: list[tuple[Shard, dict[str, Any]]] = []
    rest: list[tuple[Shard, dict[str, Any]]] = []
    for s, b in got:
        m = _rows(b)
        if k >= m:
            out.append((s, b))
        elif k > 0:
            out.append((s, {key: v[:k] for key, v in b.items()}))
            rest.append((s, {key: v[k:] for key, v in b.items()}))
        else:
            rest.append((s, b))
        k = max(k - m, 0)
    return _joined(out), rest, filled


def _joined(parts: list[tuple[Shard, dict[str, Any]]]) -> dict[str, Any]:
    """One batch of the parts' rows, one after the other, with ``shard``."""
    first = parts[0][1]
    out: dict[str, Any] = {}
    for key, v in first.items():
        join = Jagged.concatenate if isinstance(v, Jagged) else np.concatenate
        out[key] = join([b[key] for _, b in parts])
    out["shard"] = np.concatenate([np.full(_rows(b), s.index, np.int32) for s, b in parts])
    return out
