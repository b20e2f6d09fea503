"""``Shard``: the Ray actor that owns one node's shard of a :class:`ShardedBuffer`.

It lives on its node (node-affinity scheduling, so a restart stays there) and holds a
handle on the node's segment, which it made with ``persist=True``: when the actor dies
(crash, OOM kill, ``ray.kill`` with restarts), Ray starts it again with the same
arguments and it attaches the same segment, with every row the node's writers had
written, and the writers, which never talked to it, go on writing meanwhile.

The actor is detached (it does not die with the process that created it). A
non-persistent buffer's shards end with their creator all the same: they watch a
:class:`Lease`, an actor that the creator owns and that Ray destroys when the creator
ends, however it ends.

The actor is on the sampling path only: writers attach the segment by name
(:meth:`ShardedBuffer.local`) and write into it directly. Every answer carries the
shard's :meth:`info` (its size, and priority mass), so the learner draws the next
per-shard counts from figures one round trip old without asking again.

This module does not import Ray: :func:`actor_class` makes the remote class when a
``ShardedBuffer`` first needs it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Mapping

import numpy as np

from shmbuf.buffer.handle import Buffer
from shmbuf.core.read import SampleTimeout
from shmbuf.episodes import EpisodeBuffer
from shmbuf.core.layout import normalize_fields
from shmbuf.ragged import schema as ragged_schema

NAMESPACE = "shmbuf"
"""The Ray namespace of the shard and lease actors (named ``<buffer>.<shard>`` and
``<buffer>.lease``), so that any job can find a buffer by name."""
LEASE_EVERY = 1.0
"""Seconds between two checks that the creator of a non-persistent buffer is alive."""
SAMPLERS = {"buffer": ("sample", "sample_sequences"),
            "episodes": ("sample", "sample_sequences", "sample_trajectories")}


class Shard:
    """One node's shard: a Buffer (``kind="buffer"``) or an EpisodeBuffer
    (``"episodes"``) named ``segment``, created with ``options`` (those of
    ``Buffer.create`` / ``EpisodeBuffer.create``), or attached if it already exists and
    this is a restart (or ``exist_ok``)."""

    def __init__(self, segment: str, kind: str, fields: Mapping[str, Any], capacity: int,
                 options: Mapping[str, Any], seed: int, exist_ok: bool, lease: str | None) -> None:
        import ray
        self.error: BaseException | None = None  # reported by info(), not raised: Ray would retry __init__
        self.buf: Any = None
        self.segment, self.kind = segment, kind
        self.node = _node()
        cls = EpisodeBuffer if kind == "episodes" else Buffer
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        try:
            try:
                self.buf = cls.create(fields, capacity, name=segment, seed=seed, persist=True, **options)
            except FileExistsError:
                if not (restarted or exist_ok):
                    raise FileExistsError(
                        f"a buffer named {segment!r} already exists on node {self.node} (left by an earlier "
                        "run whose driver was killed?): pass exist_ok=True to take over its rows, or remove "
                        f"it on that node with `shmbuf rm {segment}`") from None
                self.buf = cls.attach(segment, seed=seed)
                _check_same(self.buf, fields, capacity, options.get("priority"))
        except BaseException as exc:  # (the creator's error, as it is, for ShardedBuffer.create)
            if self.buf is not None:
                self.buf.close()
                self.buf = None
            self.error = exc
            return
        self.core: Buffer = self.buf.core if kind == "episodes" else self.buf
        if lease is not None:  # a buffer that ends with its creator
            threading.Thread(target=self._watch, args=(lease,), daemon=True, name="shmbuf-lease").start()
            previous = signal.getsignal(signal.SIGTERM)

            def on_term(signum: int, frame: Any) -> None:  # (Ray stops the cluster)
                self.core.unlink()
                if callable(previous):
                    previous(signum, frame)
                else:
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)

            signal.signal(signal.SIGTERM, on_term)

    def _watch(self, lease: str) -> None:
        """End the shard once its creator is gone, however it went (a SIGKILLed driver
        too): the lease is an actor the creator owns, which Ray destroys with its owner,
        and its name with it. The shard actor itself is detached, so it outlives the
        creator to do this; a restart of it (a crash) re-attaches its rows, and watches
        again. (The lease goes by name, not as a handle among the constructor's
        arguments: Ray could not restart an actor whose arguments are gone.)"""
        import ray
        missing = 0
        while missing < 2:  # (twice in a row: a name lookup that fails once may be a hiccup)
            time.sleep(LEASE_EVERY)
            try:
                ray.get_actor(lease, namespace=NAMESPACE)
                missing = 0
            except ValueError:  # no actor of that name: gone
                missing += 1
            except Exception:  # (the GCS is slow or restarting: not proof that it is gone)
                missing = 0
        self.core.unlink()  # (the name only: a call running now keeps its mapping)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def info(self) -> dict[str, Any]:
        """``size`` (rows a sample draws from: transitions of an episode buffer),
        ``mass`` and ``low`` (priority mass and smallest ``p**a``; 0 when not
        prioritized), ``alpha`` (the priority exponent ``a``; None when not
        prioritized), ``capacity``, ``node``, ``pid``, ``native`` (the C path or pure
        Python), ...; raises what creating the shard raised."""
        if self.error is not None:
            raise self.error
        b = self.buf
        size = b.transition_count if self.kind == "episodes" else len(b)
        mass = low = 0.0
        alpha = None
        if self.core.prioritized:
            trees = self.core.engine.priorities
            mass, low = trees.totals(self.core.timeout)
            alpha = trees.alpha
        return {"size": int(size), "mass": mass, "low": low, "alpha": alpha, "node": self.node,
                "pid": os.getpid(), "segment": self.segment, "capacity": self.core.capacity, "kind": self.kind,
                "prioritized": self.core.prioritized, "native": self.core.native, "lengths": self._lengths(),
                "queue": self.core.parts.keywords.get("mode") == "queue"}

    def sample(self, request: tuple[str, int, tuple, dict[str, Any]]) -> tuple[dict[str, np.ndarray], dict]:
        """``n`` rows from ``buf.<method>(n, *args, **kwargs)`` (``request``: those four,
        one argument: one serialisation a call) and the shard's info after.
        A prioritized shard returns ``p``, each row's ``p**a`` as drawn, instead of a
        weight: the learner weighs by the cluster's smallest priority, not this
        shard's. (The shard's trees change only in this actor's calls, one at a time,
        unless a process samples or updates the shard itself through ``local()``.)"""
        if self.error is not None:
            raise self.error
        method, n, args, kwargs = request
        if method not in SAMPLERS[self.kind]:
            raise ValueError(f"a {self.kind} shard samples with {SAMPLERS[self.kind]}, not {method!r}")
        batch = getattr(self.buf, method)(n, *args, **kwargs)
        if self.core.prioritized and method == "sample":
            del batch["weight"]
            batch["p"] = self.core.engine.priorities.leaf_values(batch["index"][:, 0])
        return batch, self.info()

    def take(self, request: tuple[int, dict[str, Any]]) -> tuple[dict[str, Any] | None, dict]:
        """Up to ``n`` rows of a queue shard, ``buf.take(n, partial=True, **kwargs)``
        (``request``: those two), None if none came within its ``timeout``; and the
        shard's info after (its rows not yet taken)."""
        if self.error is not None:
            raise self.error
        n, kwargs = request
        try:
            batch = self.buf.take(n, partial=True, **kwargs)
        except SampleTimeout:
            return None, self.info()
        return batch, self.info()

    def _lengths(self) -> dict[str, str]:
        """What a token budget may count (the ragged fields' names and their lengths'),
        each with a ragged field that has its lengths."""
        out: dict[str, str] = {}
        for k, (shape, _) in self.core.fields.items():
            if shape and (shape[0] is None or isinstance(shape[0], str)):
                out[k] = k
                if shape[0] is not None:
                    out.setdefault(shape[0], k)
        return out

    def versions(self, bound: int | None) -> tuple[int | None, int]:
        """The shard's newest version (None: empty), and how many rows it holds of version
        ``>= bound`` (0 for None): what the learner splits a sample by staleness by."""
        if self.error is not None:
            raise self.error
        if self.kind != "buffer":
            raise ValueError("a sample by version is for shards of a shmbuf.Buffer (created with versions=True)")
        return self.buf.newest_version, 0 if bound is None else self.buf.rows_since(bound)

    def update_priorities(self, index: np.ndarray, priorities: np.ndarray) -> tuple[int, dict]:
        """How many rows of ``index`` (slot, row) were set, and the info after (the new mass)."""
        if self.error is not None:
            raise self.error
        return self.buf.update_priorities(index, priorities), self.info()

    def stats(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return {**self.core.stats(), **self.info()}

    def pid(self) -> int:
        return os.getpid()

    def flush(self) -> None:
        """``flush`` the shard (a durability point of a shard in a file)."""
        if self.error is not None:
            raise self.error
        self.core.flush()

    def unlink(self) -> bool:
        """Remove the segment (its rows are gone for every handle); True if it was there."""
        if self.buf is None:
            return False
        was = not self.core.unlinked
        self.core.unlink()
        self.buf.close()
        self.buf, self.error = None, FileNotFoundError(f"shard {self.segment!r} was removed")
        return was


def _node() -> str:
    import ray
    return ray.get_runtime_context().get_node_id()


def _check_same(buf: Any, fields: Mapping[str, Any], capacity: int, alpha: Any) -> None:
    """The shard found is the one asked for (the same fields, capacity and priority
    exponent ``alpha``, None for none: the learner draws across shards by one)."""
    fixed, spec = ragged_schema.split(fields)
    want = {f.name: (f.shape, f.dtype) for f in normalize_fields(fixed)}
    want.update({r.name: (r.shape, r.dtype) for r in ragged_schema.fields(spec)} if spec is not None else {})
    if buf.capacity != capacity or buf.fields != want:
        raise ValueError(f"the existing shard {buf.name!r} holds {buf.capacity} rows of {buf.fields}, not "
                         f"{capacity} rows of {want}: remove it with `shmbuf rm {buf.name}` on its node, "
                         "or use another name")
    core = getattr(buf, "core", buf)  # (an EpisodeBuffer's Buffer)
    have = core.parts.keywords["priority"]
    if (have is None) != (alpha is None) or have is not None and have != float(alpha):
        def said(a: Any) -> str:
            return "no priorities" if a is None else f"priority exponent {a:g}"
        raise ValueError(f"the existing shard {buf.name!r} has {said(have)}, not {said(alpha)} as asked "
                         f"(priority={alpha!r}): a sample across shards draws by one exponent; remove it "
                         f"with `shmbuf rm {buf.name}` on its node, or pass priority={have!r}")


class Lease:
    """An actor owned by the process that created a non-persistent ShardedBuffer: Ray
    destroys it when that process ends, however it ends, and its shards then end too."""

    def ping(self) -> bool:
        return True


_remote: dict[type, Any] = {}


def actor_class(cls: type = Shard) -> Any:
    """``ray.remote(cls)``, made once."""
    if cls not in _remote:
        import ray
        _remote[cls] = ray.remote(cls)
    return _remote[cls]
