"""Actor processes that write into a shared buffer while the learner samples it: the
boilerplate of asynchronous RL (processes, a stop signal, the latest weights, episode
statistics back to the learner, retries under a rate limit, restarts) in one class.

The learner makes the buffer (any shmbuf buffer or facade: each travels to the actors
by name) and, optionally, :class:`shmbuf.Weights`; :class:`Actors` starts ``n`` processes
that each run ``fn(actor)``, where ``actor`` (an :class:`Actor`) holds the attached
buffer, the weights, its index and seed, and says when to stop::

    def act(actor):                            # in each actor process
        env, policy = make_env(actor.seed), make_policy()
        while not actor.stopped:
            actor.pull(policy)                 # the newest weights, if any
            ...                                # step the env, add to actor.buffer
            actor.report(episodic_return=r)    # to the learner

    with shmbuf.Actors(act, buf, 2, weights=w) as actors:   # the learner
        while learning:
            for stats in actors.reports(): ...
            batch = buf.sample(256)

**Nobody stays behind because the learner died.** Each actor watches its learner (its
parent process): once it is gone (SIGKILL, a crash), ``stopped`` turns True, and an
actor that has not returned :data:`LEARNER_GRACE` seconds later exits all the same.
So the actors end, and with them the last holders of the learner's resource tracker,
which then removes the buffer's segment.

**Nobody hangs because an actor died.** The stop signal is a byte in shared memory (no
lock an actor could die holding), each actor reports through a pipe of its own (a
dead one only breaks its own), and :meth:`Actors.reports` restarts an actor that died
(SIGKILL, an exception) unless ``restart=False``. The restarted actor attaches again;
the lanes its predecessor claimed are free again (their claimer is dead), so it
claims them: **no lane freezes** with a dead actor's old rows being sampled forever.
A dead actor's rows stay in the buffer until new rows overwrite them.

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 64, lanes=2)
    >>> with shmbuf.Actors(shmbuf.actors.example_actor, buf, 2) as actors:
    ...     got = actors.wait_reports(2, timeout=60)
    >>> sorted(r["actor"] for r in got), len(buf)
    ([0, 1], 20)
    >>> buf.close()
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import threading
import time
from typing import Any, Callable

from shmbuf.rate.limit import RateLimitTimeout
from shmbuf.actors.weights import Weights


LEARNER_GRACE = 5.0
"""Seconds an actor has to return once its learner died before its process exits."""
WATCH_EVERY = 0.2  # seconds between two looks at the learner
TERM_GRACE = 2.0
"""Seconds :meth:`Actors.stop` gives the actors it terminated (SIGTERM), all together,
before it kills them (SIGKILL)."""


class Actor:
    """What an actor function gets, in its process: ``buffer`` (attached), ``weights``
    (a :class:`shmbuf.Weights` handle, or None), ``index`` (0 .. n-1), ``seed`` (differs
    per actor and per restart), ``restarts`` (how often this index was restarted)."""

    def __init__(self, index: int, seed: int, restarts: int, buffer: Any, weights: Any, stop: Any,
                 conn: Any) -> None:
        self.index, self.seed, self.restarts = index, seed, restarts
        self.buffer, self.weights = buffer, weights
        self._stop, self._conn = stop, conn
        self.version: int | None = None  # the weights' version pulled last
        self.learner = os.getppid()  # (the process that started this one)
        self.orphaned = False  # set by the watch once the learner is gone

    @property
    def stopped(self) -> bool:
        """True once the learner asked the actors to stop, or died."""
        return bool(self._stop.value) or self.orphaned or os.getppid() != self.learner

    def _watch(self) -> None:
        """(A daemon thread) once the learner is gone: ``stopped``; after
        :data:`LEARNER_GRACE` seconds more, exit the process (see the module)."""
        while os.getppid() == self.learner:
            time.sleep(WATCH_EVERY)
        self.orphaned = True
        time.sleep(LEARNER_GRACE)
        os._exit(3)

    def report(self, **stats: Any) -> None:
        """Send ``stats`` (picklable values) to the learner (:meth:`Actors.reports`)."""
        self._conn.send({"actor": self.index, **stats})

    def pull(self, model: Any, *, timeout: float = 10.0) -> int | None:
        """Load the newest weights into ``model`` (a torch module, or a dict of arrays) if newer than
        the ones it has; returns the new version, or None (``timeout``: :meth:`shmbuf.Weights.read`'s)."""
        if self.weights is None:
            return None
        got = self.weights.load_into(model, newer_than=self.version, timeout=timeout)
        if got is not None:
            self.version = got
        return got

    def retry(self, call: Callable[..., Any], *args: Any, timeout: float = 1.0, **kwargs: Any) -> bool:
        """Call ``call(*args, timeout=timeout, **kwargs)`` again while a rate limit holds
        it back (``RateLimitTimeout``): True once it went through, False if the learner
        asked to stop first (so an actor never waits on a learner that is done)."""
        while not self.stopped:
            try:
                call(*args, timeout=timeout, **kwargs)
                return True
            except RateLimitTimeout:
                continue
        return False


def _main(fn: Callable[[Actor], Any], index: int, seed: int, restarts: int, buffer: Any, weights: str | None,
          stop: Any, conn: Any, args: tuple, kwargs: dict) -> None:
    """An actor process: attach, run ``fn``, close."""
    w = Weights.attach(weights) if weights is not None else None
    actor = Actor(index, seed, restarts, buffer, w, stop, conn)
    if getattr(buffer, "versioned", False):
        buffer.bind(actor)  # (its rows carry the version of the weights this actor last pulled)
    threading.Thread(target=actor._watch, name="shmbuf-learner-watch", daemon=True).start()
    try:
        fn(actor, *args, **kwargs)
    finally:
        for handle in (buffer, w):
            if handle is not None:
                handle.close()
        conn.close()


class Actors:
    """``n`` processes running ``fn(actor, *args, **kwargs)`` (see the module); started
    at once.

    ``buffer``: the buffer they write (it must pickle by name to a started process, as
    shmbuf's buffers and facades do); ``weights``: a :class:`shmbuf.Weights` (or its
    name) they pull from; ``seed``: actor ``i``'s seed is ``seed + 1000 * i`` plus its
    restarts; ``restart``: start a died actor again (in :meth:`reports`); ``start_method``:
    multiprocessing's (``"spawn"``: safe with threads and torch). ``fn`` must be
    importable (a module-level function)."""

    def __init__(self, fn: Callable[..., Any], buffer: Any, n: int, *, weights: Any = None, seed: int = 0,
                 restart: bool = True, start_method: str = "spawn", args: tuple = (),
                 kwargs: dict | None = None) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1 (actor processes), got {n!r}")
        self._ctx = mp.get_context(start_method)
        self._fn, self._buffer, self._args, self._kwargs = fn, buffer, args, dict(kwargs or {})
        self._weights = weights if weights is None or isinstance(weights, str) else weights.name
        self._seed, self.restart = seed, restart
        self._stop = self._ctx.RawValue("b", 0)  # (no lock: an actor may die at any instant)
        self._procs: list[Any] = [None] * n
        self._conns: list[Any] = [None] * n
        self._pending: list[dict[str, Any]] = []  # reports read by stop(), for the next reports()
        self.restarts = [0] * n
        self._start_all()

    def _start(self, i: int) -> None:
        recv, send = self._ctx.Pipe(duplex=False)
        p = self._ctx.Process(target=_main, name=f"shmbuf-actor-{i}", daemon=True,
                              args=(self._fn, i, self._seed + 1000 * i + self.restarts[i], self.restarts[i],
                                    self._buffer, self._weights, self._stop, send, self._args, self._kwargs))
        p.start()
        send.close()
        self._procs[i], self._conns[i] = p, recv

    def _start_all(self) -> None:
        try:
            for i in range(len(self._procs)):
                self._start(i)
        except BaseException:
            self.stop()
            raise

    @property
    def processes(self) -> list[Any]:
        """The actors' current processes (``multiprocessing.Process``), by index."""
        return list(self._procs)

    @property
    def alive(self) -> list[bool]:
        """Per actor: is its process running?"""
        return [p is not None and p.is_alive() for p in self._procs]

    def reports(self) -> list[dict[str, Any]]:
        """What the actors reported since the last call (each a dict with ``actor``:
        its index); restarts the actors that died, if ``restart``."""
        out, self._pending = self._pending, []
        for conn in multiprocessing.connection.wait([c for c in self._conns if c is not None], timeout=0):
            i = self._conns.index(conn)
            try:
                while conn.poll():
                    out.append(conn.recv())
            except (EOFError, OSError):  # it exited (or died mid-send): its pipe is done
                conn.close()
                self._conns[i] = None
        for i, p in enumerate(self._procs):  # died (not returned): start it again
            if p.exitcode not in (None, 0) and not self._stop.value and self.restart:
                p.join()
                if self._conns[i] is not None:
                    self._conns[i].close()
                self.restarts[i] += 1
                self._start(i)
        return out

    def wait_reports(self, count: int, timeout: float) -> list[dict[str, Any]]:
        """Reports until ``count`` arrived or ``timeout`` seconds passed (then what came)."""
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            out += self.reports()
            time.sleep(0.01)
        return out

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every actor to stop and wait up to ``timeout`` seconds for them all, then
        terminate the ones still running (SIGTERM), wait :data:`TERM_GRACE` seconds more
        for them all, and kill the rest (SIGKILL): within ``timeout + TERM_GRACE`` and
        the kills, however many actors ignore the stop."""
        self._stop.value = 1
        deadline = time.monotonic() + timeout
        for p in self._procs:
            if p is not None:
                p.join(max(deadline - time.monotonic(), 0))
        late = [p for p in self._procs if p is not None and p.is_alive()]
        for p in late:
            p.terminate()
        deadline = time.monotonic() + TERM_GRACE
        for p in late:
            p.join(max(deadline - time.monotonic(), 0))
        for p in late:
            if p.is_alive():
                p.kill()
        for p in late:
            p.join(TERM_GRACE)  # (SIGKILL: at once, unless the kernel holds it in a system call)
        self._pending = self.reports()  # what they said last (kept for the next reports())
        for c in self._conns:
            if c is not None:
                c.close()
        self._conns = [None] * len(self._procs)

    def __enter__(self) -> "Actors":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def example_actor(actor: Actor) -> None:
    """The module's example: add 10 rows, report, then wait to be stopped."""
    for t in range(10):
        actor.buffer.add({"x": 100 * actor.index + t})
    actor.report(rows=10)
    while not actor.stopped:
        time.sleep(0.01)
