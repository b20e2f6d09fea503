"""The core storm and the core's child processes: writers, samplers, hangs inside writes.

Code that runs in child processes lives here, importable by name (spawn, forkserver
and Ray workers import it).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import time

import numpy as np

import shmbuf
from shmbuf.core import ring

from .processes import hang_at, wait_for_file

# Storm rows: every element of every field is derived from (writer, sequence).
STORM = {"a": ((7,), "int64"), "b": ((3, 5), "float64"), "c": ((), "int32")}


def storm_rows(writer: int, seq: np.ndarray) -> dict[str, np.ndarray]:
    key = writer * 1_000_000_000 + seq
    n = len(seq)
    return {"a": np.repeat(key[:, None], 7, axis=1),
            "b": np.broadcast_to((key * 2.0)[:, None, None], (n, 3, 5)).copy(),
            "c": ((key % 1_000_003)).astype(np.int32)}


def storm_torn(batch: dict[str, np.ndarray]) -> int:
    """Rows whose fields do not all come from the same (writer, sequence)."""
    a, b = batch["a"], batch["b"]
    a, b = a.reshape(len(a), a[0].size if len(a) else 1), b.reshape(len(b), b[0].size if len(b) else 1)
    key = a[:, 0]  # (an empty batch, a save that kept no row, has no torn rows)
    ok = (a == key[:, None]).all(axis=1)
    ok &= (b == (key * 2.0)[:, None]).all(axis=1)
    ok &= batch["c"] == (key % 1_000_003).astype(np.int32)
    return int((~ok).sum())


def break_stamp_check() -> None:
    """Switch the stamp check off in this process, on both paths (a Ray job's
    ``worker_process_setup_hook``, to show that the cluster storm would see torn rows)."""
    from shmbuf.core import gather, native
    gather.FAULTS = 1
    if native.available():
        native.extension().set_faults(1)


def storm_writer(name: str, writer: int, chunk: int, seconds: float, ready, stop, results,
                 pause: float = 0.0, pure: bool = False) -> None:
    """Write storm rows for ``seconds`` (after everyone is ready) or until ``stop``;
    report how many. With ``pause``, a random sleep of up to that many seconds falls
    between the fields of a third of the writes: long overlaps that a wrapping writer
    must wait out. ``pure``: on the pure-Python path."""
    if pure:
        os.environ["SHMBUF_PURE_PYTHON"] = "1"
    buf = shmbuf.Buffer.attach(name, timeout=60)
    if pause:
        rnd = np.random.default_rng(writer)

        def hook(where: str) -> None:
            if where == "writing" and rnd.random() < 0.33:
                time.sleep(rnd.random() * pause)
        ring.set_hook(hook)
    ready.wait(30)
    seq, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        buf.extend(storm_rows(writer, np.arange(seq, seq + chunk)))
        seq += chunk
    buf.close()
    results.put((writer, seq))


def report_rows(name: str, queue) -> None:
    """Attach by name and report what is in the buffer."""
    with shmbuf.Buffer.attach(name) as buf:
        queue.put((len(buf), sorted(buf.sample(200)["x"].tolist())))


def write_range(name: str, lo: int, hi: int) -> None:
    with shmbuf.Buffer.attach(name) as buf:
        buf.extend({"x": np.arange(lo, hi)})


def write_and_hang(name: str, point: str, flag_path: str, lane=None, rows: int = 4) -> None:
    """Write one batch, stopping forever at ``point`` of the write protocol (see
    :func:`hang_at`)."""
    hang_at(point, flag_path)
    buf = shmbuf.Buffer.attach(name)
    lo = len(buf)
    buf.extend({"x": np.arange(lo, lo + rows) + 10_000}, lane=lane)


def claim_and_exit(name: str, queue) -> None:
    buf = shmbuf.Buffer.attach(name)
    queue.put(buf.claim_lane())
    queue.close()
    queue.join_thread()  # flushed before we die
    os.kill(os.getpid(), signal.SIGKILL)


def storm_sampler(name: str, seconds: float, ready, results) -> None:
    """Sample and check storm rows for ``seconds``; report (rows checked, torn rows)."""
    buf = shmbuf.Buffer.attach(name, seed=os.getpid())
    ready.wait(30)
    checked = torn = 0
    deadline = time.monotonic() + seconds
    while len(buf) == 0 and time.monotonic() < deadline:  # the writers have just started
        time.sleep(0.001)
    while time.monotonic() < deadline:
        torn += storm_torn(buf.sample(32))
        checked += 32
    buf.close()
    results.put(("sampler", checked, torn))


def writers_and_samplers(name: str, ctx, seconds: float = 2.0, writers: int = 2, samplers: int = 2):
    """``writers`` storm writers (5 rows a write) and ``samplers`` storm samplers, all
    processes of ``ctx``, on the buffer ``name`` for ``seconds``: (each sampler's
    (rows checked, torn rows), each writer's rows written); every process exited 0."""
    ready, stop, results = ctx.Barrier(writers + samplers), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=storm_writer, args=(name, w, 5, seconds, ready, stop, results))
             for w in range(writers)]
    procs += [ctx.Process(target=storm_sampler, args=(name, seconds, ready, results)) for _ in range(samplers)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return [g[1:] for g in got if g[0] == "sampler"], [g[1] for g in got if g[0] != "sampler"]


def add_through_interrupts(name: str, ready_path: str, stop_path: str, idle_path: str) -> None:
    """Add rows in a loop that catches KeyboardInterrupt (a notebook catching Ctrl-C and
    going on); once ``stop_path`` exists, say so in ``idle_path`` and stay alive, idle.

    The SIGINT handler raises KeyboardInterrupt (as Python's default one does) only while
    ``add`` runs, so interrupts land inside ``add`` and never in this loop's bookkeeping,
    which would end the process."""
    inside = [False]

    def on_sigint(signum, frame):
        if inside[0]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    buf = shmbuf.Buffer.attach(name, timeout=30)
    open(ready_path, "w").close()
    interrupted = i = 0
    while not os.path.exists(stop_path):
        for _ in range(50):
            i += 1
            try:
                inside[0] = True
                buf.add({"x": i}, timeout=30)
                inside[0] = False
            except KeyboardInterrupt:
                inside[0] = False
                interrupted += 1
    with open(idle_path, "w") as f:
        f.write(str(interrupted))
    while True:
        time.sleep(1)


def patch_schema_doc(raw: bytearray, edit) -> None:
    """Rewrite the schema JSON of a segment image in place with ``edit(document)``; the
    result must fit where the old schema was."""
    off, size = struct.unpack_from("<QQ", raw, 48)  # schema offset and size
    doc = json.loads(bytes(raw[off:off + size]))
    edit(doc)
    new = json.dumps(doc, separators=(",", ":")).encode()
    assert len(new) <= size, "the edited schema must fit where the old one was"
    raw[off:off + size] = new.ljust(size)


def rate_writer(name: str, rows: int, chunk: int, seconds: float, ready, results) -> None:
    """Attach and add ``chunk``-row batches until ``rows`` are written or ``seconds``
    pass, waiting on the rate limit with short timeouts; report rows written."""
    buf = shmbuf.Buffer.attach(name)
    ready.wait(30)
    written, deadline = 0, time.monotonic() + seconds
    while written < rows and time.monotonic() < deadline:
        try:
            buf.extend({"x": np.arange(written, written + chunk)}, timeout=0.05)
            written += chunk
        except shmbuf.RateLimitTimeout:
            pass
    buf.close()
    results.put(written)


def write_rows_then_hang(name: str, rows: int, flag: str) -> None:
    """Add ``rows`` rows (x = 0, 1, ...) one at a time, then stop forever inside the
    next write (at "writing"), touching ``flag`` there."""
    buf = shmbuf.Buffer.attach(name)
    for x in range(rows):
        buf.add({"x": x})
    hang_at("writing", flag)
    buf.add({"x": rows})

def write_and_wait(name: str, rows: int, flag: str, go: str) -> None:
    """Write ``rows`` rows (x = 100, 101, ...) to the buffer ``name``, stopping inside the
    write (at "writing": reserved, not published) until ``go`` exists, touching ``flag``
    there; then finish it."""
    def hook(where: str) -> None:
        if where == "writing":
            ring.set_hook(None)
            open(flag, "w").close()
            while not os.path.exists(go):
                time.sleep(0.01)
    buf = shmbuf.Buffer.attach(name)
    ring.set_hook(hook)
    buf.extend({"x": np.arange(100, 100 + rows)})
    buf.close()


def start_hanging_writer(name: str, point: str, tmp_path, lane=None, rows: int = 4, tag: str = ""):
    """A spawned writer stopped for good at ``point`` of writing ``rows`` rows (see
    :func:`write_and_hang`); returns once it is there."""
    import multiprocessing as mp

    flag = tmp_path / f"at-{point}{tag}"
    proc = mp.get_context("spawn").Process(target=write_and_hang, args=(name, point, str(flag), lane, rows))
    proc.start()
    wait_for_file(flag, proc, "writer never reached " + point)
    return proc


__all__ = ['start_hanging_writer', 'writers_and_samplers', 'STORM', 'add_through_interrupts', 'break_stamp_check', 'claim_and_exit', 'patch_schema_doc', 'rate_writer', 'report_rows', 'storm_rows', 'storm_sampler', 'storm_torn', 'storm_writer', 'write_and_hang', 'write_and_wait', 'write_range', 'write_rows_then_hang']
