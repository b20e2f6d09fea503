"""Actor functions for tests/test_actors.py (spawned processes import them by name)."""

from __future__ import annotations

import os
import time

import numpy as np


def _write_and_say_so(actor, flag_dir: str) -> None:
    """Write 5 rows marked with this actor's index and restarts, say so with a file
    ``<index>-<restarts>`` holding the pid."""
    for t in range(5):
        actor.buffer.add({"who": 10 * actor.index + actor.restarts, "t": t})
    path = os.path.join(flag_dir, f"{actor.index}-{actor.restarts}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)


def write_then_park(actor, flag_dir: str) -> None:
    """Write and say so (see _write_and_say_so), then wait to be stopped."""
    _write_and_say_so(actor, flag_dir)
    actor.report(seed=actor.seed, restarts=actor.restarts)
    while not actor.stopped:
        time.sleep(0.01)


def add_under_the_limit(actor) -> None:
    """Add rows under a rate limit until stopped, then report how many went in."""
    n = 0
    while actor.retry(actor.buffer.add, {"who": actor.index, "t": n}, timeout=0.05):
        n += 1
    actor.report(added=n)


def pull_weights(actor) -> None:
    """Wait for a version of the weights newer than none, then report it and its values
    (the model: a dict of arrays; a torch module works the same way)."""
    model = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(1, np.float32)}
    while not actor.stopped:
        if actor.pull(model) is not None:
            actor.report(version=actor.version, bias=float(model["b"][0]))
            return
        time.sleep(0.01)


def ignore_the_stop(actor) -> None:
    while True:
        time.sleep(0.1)


def fail(actor) -> None:
    raise RuntimeError(f"actor {actor.index} fails on purpose")


FIELDS = {"who": ((), np.int64), "t": ((), np.int64)}


def learner_then_hang(name: str, flag_dir: str, obey: bool) -> None:
    """A learner (run in its own process, its stderr to a file): a buffer, two actors
    (that obey the stop flag, or ignore it), their pids in ``<flag_dir>/actors``, then
    it waits to be killed."""
    import sys
    import shmbuf
    err = os.open(os.path.join(flag_dir, "learner.err"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(err, 2)
    sys.stderr = os.fdopen(2, "w")
    buf = shmbuf.Buffer.create(FIELDS, 64, lanes=2, name=name)
    actors = shmbuf.Actors(write_then_park if obey else write_then_ignore, buf, 2, args=(flag_dir,))
    for i in range(2):
        while not os.path.exists(os.path.join(flag_dir, f"{i}-0")):
            time.sleep(0.01)
    with open(os.path.join(flag_dir, "actors.tmp"), "w") as f:
        f.write(" ".join(str(p.pid) for p in actors.processes))
    os.rename(os.path.join(flag_dir, "actors.tmp"), os.path.join(flag_dir, "actors"))
    while True:
        time.sleep(1)


def write_then_ignore(actor, flag_dir: str) -> None:
    """Write and say so, then never look at ``stopped`` again."""
    _write_and_say_so(actor, flag_dir)
    while True:
        time.sleep(0.1)


def write_with_pulled_versions(actor) -> None:
    """Write a row before any pull (refused: no version yet), then pull each new version
    of the weights and write a row under it, until stopped; report what was refused and
    the versions pulled."""
    refused = ""
    try:
        actor.buffer.add({"who": actor.index, "t": -1})
    except ValueError as exc:
        refused = str(exc)
    model = {"w": np.zeros(2)}
    pulled = []
    while not actor.stopped and len(pulled) < 2:
        if actor.pull(model) is not None:
            pulled.append(actor.version)
            actor.buffer.add({"who": actor.index, "t": int(model["w"][0])})
        time.sleep(0.001)
    actor.report(refused=refused, pulled=pulled)


def ignore_stop_and_sigterm(actor, flag_dir: str) -> None:
    """Ignore SIGTERM and the stop (say so with a file ``<index>``), forever."""
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(flag_dir, str(actor.index)), "w").close()
    while True:
        time.sleep(0.1)
