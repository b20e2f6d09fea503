"""Starting, stopping and waiting for child processes at chosen points.

Code that runs in child processes lives here, importable by name (spawn, forkserver
and Ray workers import it).
"""

from __future__ import annotations

import os
import signal
import time

from shmbuf.core import ring

def hang_at(point: str, flag_path: str) -> None:
    """From now on, stop this process forever at ``point`` of the write protocol
    ("locked", "reserved" or "writing"), touching ``flag_path`` when it gets there."""
    def hook(where: str) -> None:
        if where == point:
            open(flag_path, "w").close()
            while True:
                time.sleep(1)

    ring.set_hook(hook)


def wait_for_file(path, proc, what: str = "", timeout: float = 60) -> None:
    """Wait until ``path`` exists, failing if ``proc`` (a multiprocessing Process or a
    subprocess.Popen) ends first or ``timeout`` passes."""
    alive = proc.is_alive if hasattr(proc, "is_alive") else (lambda: proc.poll() is None)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline and alive(), what or f"{path} never appeared"
        time.sleep(0.01)


def kill_when_there(target, args, flag, what, context: str = "spawn", timeout: float = 60):
    """Run ``target(*args)`` in a process (``context``: how it starts); SIGKILL it once it
    creates ``flag`` (within ``timeout``)."""
    import multiprocessing as mp

    proc = mp.get_context(context).Process(target=target, args=args)
    proc.start()
    try:
        wait_for_file(flag, proc, what, timeout)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(60)




def stop_and_join(procs, stop: str, timeout: float = 120) -> None:
    """Create the file ``stop`` (the processes' signal to end), wait for ``procs`` to
    exit, and kill the ones still running after ``timeout`` (a failed test leaves none)."""
    open(stop, "w").close()
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join(30)


def run_together(procs, ready, results, timeout: float = 120) -> list:
    """Start ``procs``, let them go at once (``ready``), and return one result of each
    from ``results`` once all are joined."""
    for p in procs:
        p.start()
    ready.set()
    got = [results.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(60)
    return got


def check_while_child_writes(target, args, check, timeout: float = 60):
    """Run ``target(*args, ready, results)`` in a spawned process and call ``check()``
    (which returns how many rows it checked) until the process ends; returns (what the
    process put in ``results``, rows checked). Fails if the process fails."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, ready, results))
    proc.start()
    ready.set()
    checked, deadline = 0, time.monotonic() + timeout
    try:
        while proc.is_alive() and time.monotonic() < deadline:
            checked += check()
        got = results.get(timeout=timeout)
    finally:
        proc.join(timeout)
    assert proc.exitcode == 0, f"the writer process failed ({proc.exitcode})"
    return got, checked


def pause_at(point: str, flag_path: str, go_path: str) -> None:
    """From now on, stop this process at ``point`` of the write protocol (touching
    ``flag_path``) until ``go_path`` exists."""
    def hook(where: str) -> None:
        if where == point:
            open(flag_path, "w").close()
            while not os.path.exists(go_path):
                time.sleep(0.01)

    ring.set_hook(hook)


def cli(*args: str, timeout: float = 120):
    """Run the shmbuf command in a subprocess: its CompletedProcess (text output)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "shmbuf", *args], capture_output=True, text=True,
                          timeout=timeout)


def start_time() -> float:
    """This process's start time, as shmbuf records it."""
    from shmbuf.core import procs

    return procs.identity()[1]

__all__ = ['check_while_child_writes', 'cli', 'hang_at', 'kill_when_there', 'pause_at', 'run_together', 'start_time', 'stop_and_join', 'wait_for_file']
