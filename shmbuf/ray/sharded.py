"""``ShardedBuffer``: one shmbuf per node of a Ray cluster, sampled as one buffer.

Writers on a node write into that node's shared memory (:meth:`ShardedBuffer.local`):
no RPC and no copy in their path. Only sampling crosses the network: the learner
draws per-shard counts (multinomial on the shards' sizes, or priority masses), asks
each shard's actor for its rows in parallel, and scatters the answers into one batch
in a random order. A shard that dies or does not answer is dropped with a
:class:`ShardWarning`, its rows are drawn from the others, and it rejoins when it
answers again; a batch is never short.
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import weakref
from collections import deque
from typing import Any, Mapping, Sequence

import numpy as np

from shmbuf.core import segment, validate
from shmbuf.buffer.handle import DEFAULT_TIMEOUT, Buffer
from shmbuf.core.batch import count
from shmbuf.episodes import EpisodeBuffer
from shmbuf.priority.trees import check_beta, check_values
from shmbuf.ragged.schema import is_ragged
from shmbuf.ray import shard as _shard
from shmbuf.ray.calls import Plan, Shard, ShardCalls, ShardsUnavailable, ShardWarning, cause, ray_module  # noqa: F401
from shmbuf.ray.shard import NAMESPACE
from shmbuf.ray.takes import Takes

class ShardedBuffer(Takes, ShardCalls):
    """A replay buffer made of one shmbuf shard per node of a Ray cluster.

    Create it once (the driver or learner), pass it to remote tasks and actors (it
    pickles as its shard table), write through :meth:`local` on each node, and sample
    from anywhere::

        import ray
        from shmbuf.ray import ShardedBuffer

        ray.init(address="auto")
        rb = ShardedBuffer.create({"obs": ((4,), "float32"), "reward": ((), "float32")},
                                  capacity_per_node=1_000_000, name="apex", priority=0.6)

        @ray.remote
        def rollout(rb):
            with rb.local() as local, local.writer() as w:
                w.add({"obs": [0, 0, 0, 0], "reward": 1.0}, priority=1.0)

        ray.get([rollout.remote(rb) for _ in range(8)])
        batch = rb.sample(512, beta=0.4)             # rows of every shard, by priority
        rb.update_priorities(batch["index"], td)     # each to its own shard
        rb.stats()["shards"]                         # per shard, and totals
    """

    # -- construction ----------------------------------------------------------------

    def __init__(self, name: str, kind: str, prioritized: bool, shards: list[Shard], *,
                 seed: Any = None, timeout: float = DEFAULT_TIMEOUT, lease: Any = None,
                 fresh: bool = False) -> None:
        self._name, self._kind, self._prioritized = name, kind, prioritized
        self._shards = shards
        self._rng = validate.rng(seed)
        self._timeout = validate.timeout(timeout)
        self._inflight: deque[Plan] = deque()
        self._held, self._late = [], []  # (a take's: see shmbuf.ray.takes)
        self._fresh = fresh  # the sizes known are those of creation: ask again before a draw
        self._finalizer: Any = None
        if lease is not None:  # the creator's handle (atexit runs this before Ray's shutdown, registered earlier)
            self._finalizer = weakref.finalize(self, _end, [s.actor for s in shards], self._timeout, lease)
            atexit.register(self._finalizer)

    @classmethod
    def create(cls, fields: Mapping[str, Any], capacity_per_node: int, *, name: str | None = None,
               nodes: Sequence[str] | None = None, episodes: bool = False, persist: bool = False,
               exist_ok: bool = False, seed: Any = None, timeout: float = DEFAULT_TIMEOUT,
               directory: str | None = None, **options: Any) -> "ShardedBuffer":
        """Create one shard of ``capacity_per_node`` rows on each node (all alive nodes,
        or the node IDs in ``nodes``), each owned by a Ray actor pinned to its node.

        Args:
            fields: the schema, as for :meth:`shmbuf.Buffer.create`.
            capacity_per_node: rows of each shard.
            name: the buffer's name (its shards' segments are ``<name>.<i>``, its actors
                are named so in the ``"shmbuf"`` Ray namespace); random if None.
            nodes: Ray node IDs (``ray.nodes()[k]["NodeID"]``) to put a shard on.
            episodes: shards are :class:`shmbuf.EpisodeBuffer` (``options`` then take
                ``observations=``, ``frame_stack=``...).
            persist: if False (default), the buffer ends with this handle: at
                :meth:`close`, or when this process ends, however it ends (SIGKILL
                too: the shards watch a lease actor this process owns, which Ray
                destroys with it, and remove themselves within a second or two). If
                True, the buffer lives until :meth:`unlink`, for any job to
                :meth:`attach`. Either way the shard actors are detached (a restart
                of one, after a crash, re-attaches its rows).
            exist_ok: take over shard segments left on their nodes by an earlier run
                (same name, fields and capacity) with their rows.
            seed: seeds this handle's draws and the shards' generators.
            timeout: default of every call's ``timeout=`` (seconds).
            directory: an absolute path of a directory on each node's local disk: shard
                ``i`` is then the buffer file ``<directory>/<name>.<i>.shmbuf`` there
                (see ``path=`` of :meth:`shmbuf.Buffer.create`: larger than memory,
                kept across restarts of the node with ``flush``); None: ``/dev/shm``.
            options: the rest of :meth:`shmbuf.Buffer.create`'s (or
                ``EpisodeBuffer.create``'s) keywords, such as ``lanes``, ``priority``,
                ``rate``: every shard gets them.

        Raises:
            RuntimeError: Ray is not initialised.
            ValueError: bad nodes, name, capacity, or options (the shard's own error).
            FileExistsError: the name is taken (by a live buffer, or by segments left
                on a node: see ``exist_ok``).
        """
        ray = ray_module()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        capacity_per_node = count(capacity_per_node, "capacity_per_node", 1)
        timeout = validate.timeout(timeout)
        persist = validate.flag(persist, "persist")
        nodes = _nodes(ray, nodes)
        if name is None:
            name = f"rb-{secrets.token_hex(4)}"
        segment.check_name(f"{name}.{len(nodes) - 1}")
        if directory is not None and not (isinstance(directory, str) and os.path.isabs(directory)):
            raise ValueError(f"directory must be an absolute path (each node resolves it on its own), "
                             f"got {directory!r}")

        ragged = [k for k, v in fields.items() if is_ragged(v)] if isinstance(fields, Mapping) else []
        if ragged and directory is not None:
            raise ValueError(f"ragged fields ({ragged}) are kept in /dev/shm only for now: shards in files "
                             "(directory=) cannot hold them; create the ShardedBuffer without directory=")

        def where(i: int) -> str:  # shard i's segment name, or file path
            return f"{name}.{i}" if directory is None else os.path.join(directory, f"{name}.{i}.shmbuf")
        if "name" in options or "persist" in options:
            raise TypeError("name= and persist= are ShardedBuffer.create's own arguments")
        kind = "episodes" if validate.flag(episodes, "episodes") else "buffer"
        seeds = validate.rng(seed).integers(2**63, size=len(nodes) + 1)
        Actor = _shard.actor_class()
        shards: list[Shard] = []
        lease = None
        try:
            if not persist:  # (owned by this process: gone when it is, and then so are the shards)
                here = ray.get_runtime_context().get_node_id()
                lease = _shard.actor_class(_shard.Lease).options(
                    name=f"{name}.lease", namespace=NAMESPACE, num_cpus=0, max_restarts=-1,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True),
                ).remote()
            for i, node in enumerate(nodes):
                actor = Actor.options(
                    name=f"{name}.{i}", namespace=NAMESPACE, lifetime="detached",
                    max_restarts=-1, max_task_retries=0, num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote(where(i), kind, fields, capacity_per_node, options, int(seeds[i]),
                         exist_ok, None if persist else f"{name}.lease")
                shards.append(Shard(i, node, where(i), actor))
            infos = ray.get([s.actor.info.remote() for s in shards], timeout=timeout)
        except BaseException as exc:
            _end([s.actor for s in shards], timeout, lease)
            if isinstance(exc, ValueError) and "already taken" in str(exc):
                raise FileExistsError(f"a ShardedBuffer named {name!r} is live on this Ray cluster: attach "
                                      "with ShardedBuffer.attach(name), or choose another name") from None
            raise cause(exc) from None
        for s, info in zip(shards, infos):
            s.take(info)
        return cls(name, kind, bool(options.get("priority") is not None), shards,
                   seed=int(seeds[-1]), timeout=timeout, lease=lease, fresh=True)

    @classmethod
    def attach(cls, name: str, *, seed: Any = None, timeout: float = DEFAULT_TIMEOUT) -> "ShardedBuffer":
        """Attach to a live ShardedBuffer by name, from any process of any job on the
        cluster (its shard actors are found by name). Shards that do not answer within
        ``timeout`` are attached as down (they rejoin when they answer).

        Raises:
            FileNotFoundError: no ShardedBuffer of this name is live on the cluster.
        """
        ray = ray_module()
        timeout = validate.timeout(timeout)
        pattern = re.compile(re.escape(segment.check_name(name)) + r"\.(\d+)")
        found = sorted(int(m.group(1)) for a in ray.util.list_named_actors(all_namespaces=True)
                       if a.get("namespace") == NAMESPACE and (m := pattern.fullmatch(a.get("name", ""))))
        if not found or found != list(range(len(found))):
            raise FileNotFoundError(f"no ShardedBuffer named {name!r} is live on this Ray cluster (shard actors "
                                    f"found: {found})")
        shards = [Shard(i, None, f"{name}.{i}", ray.get_actor(f"{name}.{i}", namespace=NAMESPACE))
                  for i in found]
        self = cls(name, "buffer", False, shards, seed=seed, timeout=timeout)
        kinds = self._refresh(shards, timeout)
        if not kinds:
            raise ShardsUnavailable(f"no shard of {name!r} answered within {timeout:g} s")
        self._kind, self._prioritized = kinds[0]
        return self

    # -- writing ---------------------------------------------------------------------

    def local(self, *, seed: Any = None, timeout: float | None = None) -> Any:
        """This node's shard, attached by name (a :class:`shmbuf.Buffer`, or an
        :class:`shmbuf.EpisodeBuffer`): write into it exactly as on one machine. Call it
        in a task or actor on a node that has a shard; close it when done.

        Raises:
            RuntimeError: this node has no shard (the message says which nodes do).
        """
        ray = ray_module()
        node = ray.get_runtime_context().get_node_id()
        for s in self._shards:
            if s.node == node:
                cls = EpisodeBuffer if self._kind == "episodes" else Buffer
                return cls.attach(s.segment, seed=seed, timeout=self._t(timeout))
        where = [s.node for s in self._shards]
        raise RuntimeError(
            f"node {node} has no shard of buffer {self._name!r} (its shards are on nodes {where}): run "
            "writers on those nodes (scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)), "
            "or create the buffer with nodes= including this one")

    # -- sampling --------------------------------------------------------------------

    def sample(self, n: int | None = None, *, beta: float | None = None, prefetch: int = 0,
               timeout: float | None = None, max_tokens: int | None = None, length: str | None = None,
               **kwargs: Any) -> dict[str, Any]:
        """``n`` rows from all shards, each row of the cluster equally likely (a
        prioritized buffer: by priority over the whole cluster, with ``weight``
        normalised by the cluster's smallest priority, and ``index`` ``(n, 3)``:
        shard, slot, row). Every batch has ``shard``, the shard each row came from.
        ``kwargs`` go to each shard's ``sample`` (``n_step=``, ``gamma=`` of episodes).

        ``prefetch=k`` keeps ``k`` more batches of the same arguments in flight, asked
        for before this one is used (they do not see priority updates made after they
        were asked for). Counts are drawn on the shard sizes (or masses) of their last
        answers. A shard that has not answered within half of ``timeout`` is dropped
        (:class:`ShardWarning`) and its rows drawn from the others.

        In a buffer created with ``versions=True``, ``min_version=``, ``max_staleness=``
        and ``version=`` are those of :meth:`shmbuf.Buffer.sample` over the whole
        cluster: the bound is the cluster's (``max_staleness`` counts from ``version``,
        else the newest row of any shard), and the rows are split across the shards by
        how many each holds of those versions (asked of them first: one more round trip).

        With ragged fields (``arena=``), a ragged field comes as one
        :class:`~shmbuf.Jagged` of the rows of every shard. ``max_tokens=T`` with
        ``length="R"``: rows of all shards that together hold at most ``T`` values of
        that length (at least one row; at most ``n`` if given). ``T`` is split across
        the shards as ``n`` is, multinomially on their sizes (or masses, or rows of the
        versions asked for): each shard draws as many rows as fit its part, and the
        answers, in a random order, are cut before the first row that would pass ``T``.

        Raises:
            ShardsUnavailable: no shard could give its rows within ``timeout``.
            ValueError: every shard is empty; or a shard's own error (bad arguments).
        """
        budget: dict[str, Any] = {}
        if max_tokens is not None or length is not None:
            if max_tokens is None or not isinstance(length, str):
                raise ValueError("a token budget takes both max_tokens= and length= (the name of the ragged field "
                                 f"or length it counts), got max_tokens={max_tokens!r}, length={length!r}")
            units = count(max_tokens, "max_tokens", 1)
            budget = {"length": length, "n": None if n is None else count(n, "n", 1)}
        else:
            units = count(n, "n")
        if {"min_version", "max_staleness", "version", "freshness"} & set(kwargs):
            return self._recent(units, budget, prefetch, timeout, **kwargs)
        if beta is not None or self._prioritized:
            if not self._prioritized:
                raise ValueError("beta= is for a prioritized buffer: create it with priority=<exponent>")
            beta = check_beta(beta)
            return self._take("sample", units, (), {**kwargs, **budget}, prefetch, timeout, beta)
        return self._take("sample", units, (), {**kwargs, **budget}, prefetch, timeout)

    def _recent(self, n: int, budget: dict[str, Any], prefetch: int, timeout: float | None, min_version: Any = None,
                max_staleness: Any = None, version: Any = None, freshness: Any = None) -> dict[str, Any]:
        """:meth:`sample` by version over the cluster (see there)."""
        if freshness is not None:
            raise ValueError("freshness= is not supported across shards (each shard's rows would need their "
                             "weights' sum); use max_staleness= or min_version=")
        bound = self._bound(min_version, max_staleness, version, timeout)
        sizes = {i: rows for i, (_, rows) in self._versions(bound, timeout).items()}
        return self._take("sample", n, (), {"min_version": bound, **budget}, prefetch, timeout, sizes=sizes)

    def sample_sequences(self, batch: int, length: int, *, prefetch: int = 0,
                         timeout: float | None = None, **kwargs: Any) -> dict[str, np.ndarray]:
        """``batch`` windows of ``length`` consecutive rows of one lane of one shard, as
        :meth:`shmbuf.Buffer.sample_sequences` (the count of each shard by its size);
        ``prefetch`` and faults as in :meth:`sample`."""
        return self._take("sample_sequences", count(batch, "batch"), (count(length, "length", 1),),
                          kwargs, prefetch, timeout)

    def sample_trajectories(self, batch: int, length: int, *, prefetch: int = 0,
                            timeout: float | None = None) -> dict[str, np.ndarray]:
        """``batch`` trajectories of ``length`` steps of an episode buffer's shards, as
        :meth:`shmbuf.EpisodeBuffer.sample_trajectories`; ``prefetch`` and faults as in
        :meth:`sample`."""
        if self._kind != "episodes":
            raise ValueError("sample_trajectories is for a ShardedBuffer created with episodes=True")
        return self._take("sample_trajectories", count(batch, "batch"), (count(length, "length", 1),),
                          {}, prefetch, timeout)

    def update_priorities(self, index: Any, priorities: Any, *, timeout: float | None = None) -> int:
        """Set the priorities of sampled rows: ``index`` as :meth:`sample` returned it
        (shard, slot, row), each sent to its shard. Rows overwritten since they were
        sampled are skipped, and so are the rows of shards that are down; returns how
        many were set.

        Raises:
            ValueError: a bad index or priority, each checked against the bounds of its
                own shard (its capacity, ``p**a`` at most ``largest_leaf(capacity)``)
                before any shard is asked: no priority was set.
        """
        if not self._prioritized:
            raise ValueError("update_priorities is for a prioritized buffer: create it with priority=<exponent>")
        ray_module()  # (initialised, or a clear error)
        timeout = self._t(timeout)
        idx = np.asarray(index)
        if idx.ndim != 2 or idx.shape[1] != 3 or idx.dtype.kind not in "iu":
            raise ValueError(f"index must be the (n, 3) integer array ShardedBuffer.sample returned as 'index' "
                             f"(shard, slot, row), got {idx.dtype} {idx.shape}")
        p = check_values(priorities, len(idx), "update_priorities")
        if len(idx) and (idx[:, 0].min() < 0 or idx[:, 0].max() >= len(self._shards)):
            raise ValueError(f"index: shards must be in [0, {len(self._shards)}), got {np.unique(idx[:, 0]).tolist()}")
        return self._update(idx, p, timeout)

    # -- looking at it ---------------------------------------------------------------

    def stats(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Per shard (``shards``: its :meth:`shmbuf.Buffer.stats`, ``index``, ``node``,
        ``up``) and totals over the shards that answered: ``rows``, ``capacity``,
        ``rows_inserted``, ``rows_sampled``, ``batches_sampled``, ``writes``,
        ``torn_read_retries``; ``shards_up`` of ``shards_total``."""
        timeout = self._t(timeout)
        self._poll()
        errors: dict[int, str] = {}
        answers = self._gather([(s, s.actor.stats.remote()) for s in self._shards], timeout, errors)
        per = []
        for s in self._shards:
            entry: dict[str, Any] = {"index": s.index, "node": s.node, "segment": s.segment}
            if s.index in answers:
                s.take(answers[s.index])
                entry.update(answers[s.index], up=True)
            else:
                entry.update(up=False, error=errors.get(s.index, "down"))
            per.append(entry)
        total: dict[str, Any] = {"name": self._name, "shards_total": len(per),
                                 "shards_up": sum(e["up"] for e in per), "shards": per}
        for k in ("rows", "capacity", "rows_inserted", "rows_sampled", "batches_sampled", "writes",
                  "torn_read_retries", "redraws"):
            total[k] = sum(e.get(k, 0) for e in per if e["up"])
        return total

    def __len__(self) -> int:
        """Rows over the shards that answer (asked now)."""
        self._refresh([s for s in self._shards if s.up], self._timeout)
        return sum(s.size for s in self._shards if s.up)

    @property
    def name(self) -> str:
        return self._name

    @property
    def shards(self) -> list[dict[str, Any]]:
        """Per shard, as last seen: ``index``, ``node``, ``segment``, ``up``, ``size``."""
        return [{"index": s.index, "node": s.node, "segment": s.segment, "up": s.up, "size": s.size}
                for s in self._shards]

    @property
    def timeout(self) -> float:
        return self._timeout

    def __repr__(self) -> str:
        up = sum(s.up for s in self._shards)
        return f"<shmbuf.ray.ShardedBuffer {self._name!r} {self._kind}, {up}/{len(self._shards)} shards up>"

    # -- faults ----------------------------------------------------------------------

    def _t(self, timeout: float | None) -> float:
        return self._timeout if timeout is None else validate.timeout(timeout)

    # -- the end ---------------------------------------------------------------------

    def close(self) -> None:
        """Forget the batches in flight; the handle that created a non-persistent
        buffer also ends it (as :meth:`unlink`)."""
        self._inflight.clear()
        if self._finalizer is not None:
            self._finalizer()

    def flush(self, *, timeout: float | None = None) -> None:
        """:meth:`shmbuf.Buffer.flush` on every shard at once (shards in files, made with
        ``directory=``, are then on their nodes' disks; shards in ``/dev/shm``: nothing)."""
        ray = ray_module()
        ray.get([s.actor.flush.remote() for s in self._shards], timeout=self._t(timeout))

    def unlink(self) -> None:
        """End the buffer for everyone: each shard removes its segment (its rows are
        gone) and its actor exits."""
        self._inflight.clear()
        if self._finalizer is not None:
            self._finalizer()
        else:
            _end([s.actor for s in self._shards], self._timeout)

    def __enter__(self) -> "ShardedBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickles as its shard table (names, nodes, actor handles): a copy in a task or
        actor can write (:meth:`local`) and sample; it never ends the buffer."""
        table = [(s.index, s.node, s.segment, s.actor) for s in self._shards]
        return (_rebuild, (self._name, self._kind, self._prioritized, table, self._timeout))


def _rebuild(name: str, kind: str, prioritized: bool, table: list, timeout: float) -> ShardedBuffer:
    return ShardedBuffer(name, kind, prioritized, [Shard(*row) for row in table], timeout=timeout, fresh=True)


def _end(actors: list[Any], timeout: float, lease: Any = None) -> None:
    """Ask each shard to remove its segment (up to ``timeout``), then stop the actors
    (and the lease)."""
    try:
        import ray
        if not ray.is_initialized():
            return  # (this job has ended: its lease is gone, and the shards end themselves)
        refs = [a.unlink.remote() for a in actors]
        ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for a in actors + ([lease] if lease is not None else []):
            ray.kill(a, no_restart=True)
    except Exception:  # (at exit, with Ray half shut down: the shards see the lease go)
        pass


def _nodes(ray: Any, nodes: Sequence[str] | None) -> list[str]:
    alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    if nodes is None:
        return alive
    if isinstance(nodes, str) or not isinstance(nodes, Sequence) or not nodes:
        raise ValueError(f"nodes must be a non-empty list of Ray node IDs (ray.nodes()[k]['NodeID']), got {nodes!r}")
    nodes = list(nodes)
    bad = [n for n in nodes if n not in alive]
    if bad or len(set(nodes)) != len(nodes):
        raise ValueError(f"nodes must be distinct IDs of alive nodes: {bad or 'repeated'} "
                         f"(alive: {alive})")
    return nodes
