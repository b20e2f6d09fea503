"""Code that runs in child processes (importable, so spawn and forkserver can use it)."""

from __future__ import annotations

import json
import os
import signal
import struct
import time

import numpy as np

import shmbuf
from shmbuf.core import ring

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


def copy_windows_unchecked(ring_, lane, first, length, lo, out, per_row=False, same=None, skip=None):
    """``sampling.copy_windows`` without its stamp check (the ``break_protection``
    fixture's "stamp check"): it copies whatever the slots hold."""
    from shmbuf.core import sampling
    scatter = None
    if out and isinstance(out[0], list):
        out, scatter = sampling.by_position(ring_, len(first), length, out)
    rows, _ = sampling._rows(ring_, lane, first, length)
    for src, dst in zip(ring_.arrays.values(), out):
        if dst is not None:
            np.take(src, rows.ravel(), axis=0, out=dst, mode="clip")
    if scatter is not None:
        scatter()
    kept = sampling.filters(ring_, rows, length, same, skip)  # only the stamps go unchecked
    if kept is None or kept.all():
        return None  # "all intact"
    return kept.reshape(-1, length) if per_row else kept.reshape(-1, length).all(axis=1)


def break_stamp_check() -> None:
    """Switch the stamp check off in this process, on both paths (a Ray job's
    ``worker_process_setup_hook``, to show that the cluster storm would see torn rows)."""
    from shmbuf.core import native, sampling
    sampling.copy_windows = copy_windows_unchecked
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


def hang_at(point: str, flag_path: str) -> None:
    """From now on, stop this process forever at ``point`` of the write protocol
    ("locked", "reserved" or "writing"), touching ``flag_path`` when it gets there."""
    def hook(where: str) -> None:
        if where == point:
            open(flag_path, "w").close()
            while True:
                time.sleep(1)

    ring.set_hook(hook)


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


def wait_for_file(path, proc, what: str = "", timeout: float = 60) -> None:
    """Wait until ``path`` exists, failing if ``proc`` (a multiprocessing Process or a
    subprocess.Popen) ends first or ``timeout`` passes."""
    alive = proc.is_alive if hasattr(proc, "is_alive") else (lambda: proc.poll() is None)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline and alive(), what or f"{path} never appeared"
        time.sleep(0.01)


def kill_when_there(target, args, flag, what):
    """Run ``target(*args)`` in a spawned process; SIGKILL it once it creates ``flag``."""
    import multiprocessing as mp

    proc = mp.get_context("spawn").Process(target=target, args=args)
    proc.start()
    try:
        wait_for_file(flag, proc, what)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)


def start_hanging_writer(name: str, point: str, tmp_path, lane=None, rows: int = 4, tag: str = ""):
    """A spawned writer stopped for good at ``point`` of writing ``rows`` rows (see
    :func:`write_and_hang`); returns once it is there."""
    import multiprocessing as mp

    flag = tmp_path / f"at-{point}{tag}"
    proc = mp.get_context("spawn").Process(target=write_and_hang, args=(name, point, str(flag), lane, rows))
    proc.start()
    wait_for_file(flag, proc, "writer never reached " + point)
    return proc


def patch_schema_doc(raw: bytearray, edit) -> None:
    """Rewrite the schema JSON of a segment image in place with ``edit(document)``; the
    result must fit where the old schema was."""
    off, size = struct.unpack_from("<QQ", raw, 48)  # schema offset and size
    doc = json.loads(bytes(raw[off:off + size]))
    edit(doc)
    new = json.dumps(doc, separators=(",", ":")).encode()
    assert len(new) <= size, "the edited schema must fit where the old one was"
    raw[off:off + size] = new.ljust(size)


def episode_writer_then_hang(name: str, flag: str, steps: int) -> None:
    """Attach to episode buffer ``name``, write a complete episode (obs 100, 101, final
    102), then ``steps`` steps of one in progress (obs t, reward t), create ``flag``,
    then sleep until killed."""
    buf = shmbuf.EpisodeBuffer.attach(name)
    w = buf.writer()
    w.add_episode({"obs": [[100, 100], [101, 101]], "reward": [1, 1], "next_obs": [102, 102]})
    for t in range(steps):
        w.add({"obs": [t, t], "reward": float(t)}, terminated=False, truncated=False)
    open(flag, "w").close()
    time.sleep(600)


# Simple episodes: observation (start + t) twice, action t, the rewards given.
EPISODE_FIELDS = {"obs": ((2,), "float32"), "action": ((), "int64"), "reward": ((), "float32")}


def simple_episode(start: int, rewards) -> dict:
    t = np.arange(len(rewards))
    return {"obs": (start + t)[:, None] * np.ones(2), "action": t, "reward": rewards,
            "next_obs": [start + len(rewards)] * 2}


# Episode storm: every value is derived from (writer, env, episode, step).
EPISODE_STORM = {"obs": ((3,), "int64"), "action": ((), "int64"), "reward": ((), "float64")}


def episode_key(writer, env, episode, step):
    return ((writer * 16 + env) * 1_000_000 + episode) * 1_000 + step


def episode_plan(writer: int, env: int, episode: int) -> tuple[int, bool]:
    """(steps, terminated) of an episode: random-looking, known to every process."""
    h = (writer * 7919 + env * 104729 + episode * 1299709) % 1_000_003
    return 1 + h % 23, bool(h // 23 % 2)


def episode_step(writer, env, episode, step) -> dict[str, np.ndarray]:
    key = episode_key(writer, env, episode, step)
    return {"obs": np.array([key, key + 1, key + 2]), "action": key * 3, "reward": float(step + 1)}


def episode_storm_writer(name: str, writer: int, envs: int, seconds: float, ready, stop, results,
                         finished=None, die_after: int = 0, flag: str = "") -> None:
    """Write episodes of ``envs`` envs through one vectorised writer until ``stop`` or
    ``seconds``; report how many steps. ``finished[writer * 16 + env]``: the episodes of
    that env ended so far, raised once the write that ended one has returned. With
    ``die_after``: after that many writes, stop forever inside the next one (at the
    "writing" point, touching ``flag``), to be killed there."""
    buf = shmbuf.EpisodeBuffer.attach(name, timeout=60)
    episode, step = np.zeros(envs, np.int64), np.zeros(envs, np.int64)
    written = 0
    with buf.writer(envs=envs) as w:
        if ready is not None:
            ready.wait(30)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            rows = [episode_step(writer, e, episode[e], step[e]) for e in range(envs)]
            plans = [episode_plan(writer, e, episode[e]) for e in range(envs)]
            ended = np.array([step[e] + 1 == plans[e][0] for e in range(envs)])
            term = ended & np.array([p[1] for p in plans])
            data = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in EPISODE_STORM}
            data["next_obs"] = np.stack([episode_step(writer, e, episode[e], step[e] + 1)["obs"]
                                         for e in range(envs)])
            if die_after and written == die_after * envs:
                hang_at("writing", flag)
            w.add(data, terminated=term, truncated=ended & ~term)
            written += envs
            step += 1
            episode[ended] += 1
            step[ended] = 0
            if finished is not None:
                for e in np.flatnonzero(ended).tolist():
                    finished[writer * 16 + e] = int(episode[e])
    buf.close()
    results.put((writer, written))


def episode_storm_errors(batch: dict, kind: str, n: int = 1, gamma: float = 0.5, finished=None) -> int:
    """Values of a sample that do not match the formula (0 if all do). ``finished``: the
    writers' episode counts read before the sample was asked for (see
    :func:`episode_storm_writer`)."""
    def split(key):
        key = np.asarray(key)
        return key // 1_000_000_000, key // 1_000 % 1_000_000, key % 1_000

    if kind == "episode":
        obs, k = batch["obs"], batch["obs"][:, 0]
        who, episode, step = split(k)
        w, e = who // 16, who % 16
        steps, term = episode_plan(int(w[0]), int(e[0]), int(episode[0]))
        want = np.arange(steps)
        bad = len(k) != steps or (who != who[0]).any() or (episode != episode[0]).any() or (step != want).any()
        if bad:
            return 1
        bad = (obs != k[:, None] + np.arange(3)).sum() + (batch["action"] != k * 3).sum()
        bad += (batch["next_obs"][:, 0] != k + 1).sum() + (batch["reward"] != step + 1).sum()
        bad += batch["terminated"].tolist() != [term and i == steps - 1 for i in range(steps)]
        bad += batch["truncated"].tolist() != [not term and i == steps - 1 for i in range(steps)]
        return int(bad)
    k = batch["obs"][..., 0]
    who, episode, step = split(k)
    w, e = who // 16, who % 16
    plan = np.array([episode_plan(int(a), int(b), int(c)) for a, b, c in
                     zip(w.ravel(), e.ravel(), episode.ravel())]).reshape(k.shape + (2,))
    steps, term = plan[..., 0], plan[..., 1].astype(bool)
    if kind == "trajectory":
        m = batch["mask"]
        bad = (batch["obs"][m] != k[m][:, None] + np.arange(3)).sum() + (batch["action"][m] != k[m] * 3).sum()
        bad += (batch["obs"][~m] != 0).sum() + (batch["timestep"][m] != step[m] + 1).sum()
        for row, rm in zip(k, m):  # one episode, consecutive steps, ending the window
            r = row[rm]
            bad += len(set((r // 1_000).tolist())) > 1 or (np.diff(r) != 1).any() or not rm[-1]
        last = step == steps - 1
        bad += (batch["terminated"] != (m & last & term)).sum() + (batch["truncated"] != (m & last & ~term)).sum()
        rtg = batch["returns_to_go"]
        bad += (np.abs(rtg[:, :-1] - rtg[:, 1:] - np.where(m[:, :-1], step[:, :-1] + 1, 0)) > 1e-9)[m[:, :-1]].sum()
        # the end step's: rewards step+1 from it to the episode's end (every step written
        # so far, for an episode in progress), all of them for one that ended before the call
        for i in range(len(k)):
            s, n, ep = int(step[i, -1]), int(steps[i, -1]), int(episode[i, -1])
            sums = np.cumsum(np.arange(s, n) + 1.0)  # to each step still to come
            ended_before = finished is not None and ep < finished[int(who[i, -1])]
            got = float(rtg[i, -1])
            bad += (got != sums[-1]) if ended_before else not np.isin(got, sums[min(1, len(sums) - 1):])
        return int(bad)
    bad = (batch["obs"] != k[:, None] + np.arange(3)).sum() + (batch["action"] != k * 3).sum()
    taken = batch["steps"] if "steps" in batch else np.ones(len(k), np.int64)
    want_k = np.minimum(steps - step, n)
    bad += (taken != want_k).sum() + (batch["next_obs"][:, 0] != k + taken).sum()
    ended = step + taken == steps
    bad += (batch["terminated"] != (ended & term)).sum() + (batch["truncated"] != (ended & ~term)).sum()
    if "steps" in batch:
        want_r = sum(np.where(i < taken, gamma ** i * (step + 1 + i), 0.0) for i in range(n))
        bad += (np.abs(batch["reward"] - want_r) > 1e-9).sum()
    else:
        bad += (batch["reward"] != step + 1).sum()
    return int(bad)


def episode_writer_hang_in_write(name: str, flag: str, steps: int) -> None:
    """Write ``steps`` steps of 2 envs (obs = 100 * env + t), then stop forever in the
    middle of the next write (the native path's "writing" point, or the Python path's),
    touching ``flag`` there."""
    buf = shmbuf.EpisodeBuffer.attach(name)
    w = buf.writer(envs=2)
    no = np.zeros(2, bool)

    def step(t):
        return {"obs": np.array([[t, t], [100 + t, 100 + t]], np.float32), "reward": np.ones(2, np.float32)}
    for t in range(steps):
        w.add(step(t), terminated=no, truncated=no)
    hang_at("writing", flag)
    w.add(step(steps), terminated=no, truncated=no)


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


# Goal episodes (HER): observation t of episode ep achieves goal (ep, t); every desired
# goal stored is (-1, -1), so a relabelled one shows, and says where it came from.
GOALS = {"obs": ((1,), "int64"), "achieved_goal": ((2,), "int64"), "desired_goal": ((2,), "int64"),
         "reward": ((), "float64")}
GOAL_OBS = ["obs", "achieved_goal", "desired_goal"]


def goal_step(ep: int, t: int) -> dict[str, np.ndarray]:
    return {"obs": np.array([t]), "achieved_goal": np.array([ep, t]), "desired_goal": np.array([-1, -1]),
            "reward": -1.0}


def goal_episode(ep: int, steps: int) -> dict[str, np.ndarray]:
    """An episode of ``steps`` steps (observations 0 .. steps, the last one final)."""
    t = np.arange(steps + 1)
    achieved = np.stack([np.full(steps + 1, ep), t], axis=1)
    return {"obs": t[:steps, None], "achieved_goal": achieved[:steps],
            "desired_goal": np.full((steps, 2), -1), "reward": np.full(steps, -1.0),
            "next_obs": [steps], "next_achieved_goal": achieved[steps], "next_desired_goal": [-1, -1]}


def goal_reward(achieved: np.ndarray, desired: np.ndarray, info) -> np.ndarray:
    """A reward that says which goals it was computed from."""
    return (1000 * desired[:, 1] + achieved[:, 1]).astype(np.float64)


def goal_writer(name: str, seconds: float, ready, stop, results) -> None:
    """Write goal episodes step by step (lengths 1 .. 12) for ``seconds`` or until
    ``stop``; report how many episodes."""
    buf = shmbuf.EpisodeBuffer.attach(name)
    w = buf.writer()
    ready.wait(30)
    ep, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        steps = 1 + (ep * 7) % 12
        for t in range(steps):
            end = t == steps - 1
            step = goal_step(ep, t)
            if end:
                step.update(next_obs=[steps], next_achieved_goal=[ep, steps], next_desired_goal=[-1, -1])
            w.add(step, terminated=end, truncated=False)
        ep += 1
    buf.close()
    results.put(ep)


def goal_writer_hang_in_write(name: str, flag: str, steps: int) -> None:
    """Write ``steps`` steps of goal episode 7 (in progress), then stop forever in the
    middle of writing the next one, touching ``flag`` there."""
    buf = shmbuf.EpisodeBuffer.attach(name)
    w = buf.writer()
    for t in range(steps):
        w.add(goal_step(7, t), terminated=False, truncated=False)
    hang_at("writing", flag)
    w.add(goal_step(7, steps), terminated=False, truncated=False)


def check_trees(trees) -> None:
    """Every inner node of a buffer's priority trees equals the sum (the nonzero
    minimum) of its children, exactly; the version is even."""
    s, m, lo = trees.sum, trees.min, trees.leaves
    assert int(trees.head[0]) % 2 == 0, "a change was left half done"
    while lo > 1:
        assert np.array_equal(s[lo // 2:lo], s[lo:2 * lo:2] + s[lo + 1:2 * lo:2])
        a, b = m[lo:2 * lo:2], m[lo + 1:2 * lo:2]
        assert np.array_equal(m[lo // 2:lo], np.where(a == 0, b, np.where(b == 0, a, np.minimum(a, b))))
        lo //= 2


def prio_learner(name: str, seconds: float, ready, results) -> None:
    """Sample by priority and update with random priorities for ``seconds``; report
    (rows sampled, updates applied, torn rows)."""
    buf = shmbuf.Buffer.attach(name, seed=os.getpid())
    rng = np.random.default_rng(os.getpid())
    ready.wait(30)
    sampled = applied = torn = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        b = buf.sample(32, beta=0.5)
        torn += storm_torn(b)
        sampled += 32
        applied += buf.update_priorities(b["index"], rng.random(32) * 10 + 0.1)
    buf.close()
    results.put(("learner", sampled, applied, torn))


def prio_update_then_hang(name: str, flag: str) -> None:
    """Start a priority update and stop forever in the middle of changing the trees
    (the leaves set, their ancestors not yet), touching ``flag`` there."""
    from shmbuf import priority

    def half_set(self, slots, values):
        self.sum[slots + self.leaves] = values
        self.min[slots + self.leaves] = values
        open(flag, "w").close()
        while True:
            time.sleep(1)
    priority.Trees.set = half_set
    buf = shmbuf.Buffer.attach(name)
    b = buf.sample(4)
    buf.update_priorities(b["index"], [50.0, 50.0, 50.0, 50.0])


def save_and_hang(name: str, path: str, flag: str) -> None:
    """Save buffer ``name`` to ``path``, stopping for good after the first chunk of rows
    went to disk (``flag`` then exists): a save killed in the middle."""
    from shmbuf import persist

    def stop(self, nbytes):
        open(flag, "w").close()
        time.sleep(600)
    persist.Progress.__call__ = stop
    with shmbuf.Buffer.attach(name) as buf:
        buf.save(path)


# Weights: every element of every array of version v is v.
WEIGHT_SHAPES = {"w1": (256, 256), "b1": (256,), "w2": (64, 256)}


def weights_of(version: int) -> dict:
    return {k: np.full(s, float(version), np.float32) for k, s in WEIGHT_SHAPES.items()}


def weights_mixed(params: dict, version: int) -> bool:
    """True if ``params`` are not all version ``version``."""
    return any(not (a == version).all() for a in params.values())


def weights_publisher(name: str, seconds: float, ready, results) -> None:
    w = shmbuf.Weights.attach(name)
    ready.wait(30)
    deadline, n = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        n = w.publish(weights_of(w.version + 1))
    w.close()
    results.put(("publisher", n))


def weights_reader(name: str, seconds: float, ready, results) -> None:
    w = shmbuf.Weights.attach(name)
    ready.wait(30)
    deadline, reads, mixed, last = time.monotonic() + seconds, 0, 0, 0
    while time.monotonic() < deadline:
        got = w.read(newer_than=last)
        if got is not None:
            last, params = got
            reads += 1
            mixed += weights_mixed(params, last)
    w.close()
    results.put(("reader", reads, mixed))


def weights_publish_then_hang(name: str, flag: str, persist: bool) -> None:
    """Create weights, publish version 1, then stop for good half-way through publishing
    version 2 (after its first array)."""
    w = shmbuf.Weights.create(name, weights_of(0), persist=persist)
    w.publish(weights_of(1))
    real, calls = np.copyto, [0]

    def copyto(dst, src, **kw):
        calls[0] += 1
        if calls[0] == 2:
            open(flag, "w").close()
            time.sleep(600)
        real(dst, src, **kw)
    np.copyto = copyto
    w.publish(weights_of(2))


def torch_actor(name: str, results) -> None:
    import torch

    torch.manual_seed(123)  # other initial weights than the learner's
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    w = shmbuf.Weights.attach(name)
    version = w.load_into(model)
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    results.put((version, model(x).detach().numpy().tolist(), w.load_into(model, newer_than=version)))
    w.close()


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


def imitation_storer(name: str, rounds: int, ready, results) -> None:
    """Attach an imitation ReplayBuffer by name and store transitions through its own
    ``store`` while the parent samples: obs row i is (k, k) with acts k, next_obs k+1."""
    from shmbuf.compat.imitation import ReplayBuffer, Transitions

    buf = ReplayBuffer.attach(name)
    ready.wait(30)
    for r in range(rounds):
        k = np.arange(r * 8, r * 8 + 8)
        infos = np.array([{}] * 8, dtype=object)
        buf.store(Transitions(obs=np.stack([k, k], 1).astype(np.float32), acts=k, infos=infos,
                              next_obs=np.stack([k + 1, k + 1], 1).astype(np.float32),
                              dones=k % 5 == 0))
    results.put(buf.size())
    buf.close()


def fishyrl_adder(name: str, steps: int, ready, results) -> None:
    """Attach a fishyrl SequentialBuffer by name and add steps t = 1000.. through its own
    ``add`` while the parent samples: obs is (t, t), reward t."""
    from shmbuf.compat.fishyrl import SequentialBuffer

    buf = SequentialBuffer.attach(name)
    ready.wait(30)
    for t in range(1000, 1000 + steps):
        buf.add({"obs": np.array([t, t]), "reward": np.float32(t)})
    results.put(buf.size)
    buf.close()


def velora_adder(name: str, rounds: int, ready, results) -> None:
    """Attach a velora ReplayBuffer by name and add_multi batches whose every value of a
    row is the row's key k (states k, actions k, rewards k, next_states k + 1)."""
    from shmbuf.compat.velora import ReplayBuffer

    buf = ReplayBuffer.attach(name)
    ready.wait(30)
    for r in range(rounds):
        k = np.arange(r * 4, r * 4 + 4, dtype=np.float32)
        buf.add_multi(np.repeat(k[:, None], 3, 1), k, k, np.repeat(k[:, None] + 1, 3, 1), k % 2 == 0,
                      np.repeat(k[:, None], 2, 1))
    results.put(len(buf))
    buf.close()


def fishyrl_vector_adder(name: str, steps: int, ready, results) -> None:
    """Attach an IndependentVectorizedBuffer by name; add steps t of 2 envs: env e's obs
    is 1000 * e + t."""
    from shmbuf.compat.fishyrl import IndependentVectorizedBuffer

    buf = IndependentVectorizedBuffer.attach(name)
    ready.wait(30)
    for t in range(steps):
        buf.add({"obs": np.array([[t], [1000 + t]])})
    results.put(buf.size)
    buf.close()


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


def garage_path(p: int) -> dict:
    """Path ``p`` of ``p % 5 + 1`` steps: every value of step t is ``p * 1000 + t``
    (``obs`` 3 wide, ``act`` 1 wide, float32 and int64)."""
    t = np.arange(p % 5 + 1)[:, None] + p * 1000
    return {"obs": np.repeat(t, 3, 1).astype(np.float32), "act": t.astype(np.int64)}


def garage_path_bad(path: dict) -> bool:
    """True if ``path`` is not one whole :func:`garage_path` (torn, mixed, cut)."""
    t = path["act"][:, 0]
    p = int(t[0]) // 1000
    return (len(t) != p % 5 + 1 or (t != p * 1000 + np.arange(len(t))).any()
            or (path["obs"] != t[:, None]).any())


def garage_adder(name: str, paths: int, ready, results) -> None:
    """Attach a garage PathBuffer by name and add paths 1.. through its own ``add_path``."""
    from shmbuf.compat.garage import PathBuffer

    buf = PathBuffer.attach(name)
    ready.wait(30)
    for p in range(1, paths + 1):
        buf.add_path(garage_path(p))
    results.put(buf.n_transitions_stored)
    buf.close()


def d3rlpy_buffer(buffer, **kwargs):
    """A d3rlpy-facade ReplayBuffer of float32 (2,) observations, int64 actions and
    float32 rewards (signatures given, as a user without an env would)."""
    from shmbuf.compat.d3rlpy import ActionSpace, ReplayBuffer, Signature

    return ReplayBuffer(buffer, observation_signature=Signature(dtype=[np.float32], shape=[(2,)]),
                        action_signature=Signature(dtype=[np.int64], shape=[(1,)]),
                        reward_signature=Signature(dtype=[np.float32], shape=[(1,)]),
                        action_space=ActionSpace.DISCRETE, action_size=1000, **kwargs)


def d3rlpy_obs(episode: int, t: int) -> np.ndarray:
    """The observation of step t of an episode: (episode, t)."""
    return np.array([episode, t], np.float32)


def d3rlpy_appender(name: str, episodes: int, ready, results) -> None:
    """Attach a d3rlpy-facade ReplayBuffer by name and append episodes 1.. through its
    own ``append`` / ``clip_episode``: episode e has e % 7 + 2 steps, observation (e, t),
    action t, reward e; odd episodes end terminated, even ones by a time limit."""
    from shmbuf.compat.d3rlpy import ReplayBuffer

    buf = ReplayBuffer.attach(name)
    ready.wait(30)
    for e in range(1, episodes + 1):
        for t in range(e % 7 + 2):
            buf.append(d3rlpy_obs(e, t), t, float(e))
        buf.clip_episode(e % 2 == 1)
    results.put(buf.transition_count)
    buf.close()


def d3rlpy_bad_transitions(batch) -> int:
    """Transitions of :func:`d3rlpy_appender` episodes (or of episode 0, added by the
    test) that are not what their episode says."""
    obs, nxt = batch.observations, batch.next_observations
    e, t = obs[:, 0], obs[:, 1]
    steps = e % 7 + 2
    terminal = batch.terminals[:, 0] == 1
    bad = (batch.actions[:, 0] != t) | (batch.rewards[:, 0] != e)
    bad |= terminal & ((nxt != 0).any(axis=1) | (e % 2 != 1) | (t != steps - 1))
    bad |= ~terminal & ((nxt[:, 0] != e) | (nxt[:, 1] != t + 1) | (batch.next_actions[:, 0] != t + 1))
    bad |= ~terminal & (t >= steps - 1)  # a timeout episode's last observation is no transition
    return int(bad.sum())


def pause_at(point: str, flag_path: str, go_path: str) -> None:
    """From now on, stop this process at ``point`` of the write protocol (touching
    ``flag_path``) until ``go_path`` exists."""
    def hook(where: str) -> None:
        if where == point:
            open(flag_path, "w").close()
            while not os.path.exists(go_path):
                time.sleep(0.01)

    ring.set_hook(hook)


def prio_sync_then_hang(name: str, flag: str, where: str) -> None:
    """Sample a prioritized buffer and stop forever inside the sync of its new rows:
    ``where`` "set" (entering the tree update) or "after set" (the leaves and their
    ancestors set, nothing else yet), touching ``flag`` there."""
    from shmbuf import priority

    real = priority.Trees.set

    def stop(self, slots, values):
        if where == "after set":
            real(self, slots, values)
        open(flag, "w").close()
        while True:
            time.sleep(1)
    priority.Trees.set = stop
    buf = shmbuf.Buffer.attach(name)
    buf.sample(1)


def add_rows_paused(name: str, x: int, priority: float, point: str, flag: str, go: str) -> None:
    """Add one row (``x``, at ``priority``), paused at ``point`` until ``go`` exists."""
    buf = shmbuf.Buffer.attach(name)
    pause_at(point, flag, go)
    buf.add({"x": x}, priority=priority)
    buf.close()


def episode_steps_then_hang_in_write(name: str, flag: str, steps: int) -> None:
    """Write ``steps`` steps (obs [t], reward 1) of an episode in progress, then stop
    forever inside the write of the next one, touching ``flag`` there."""
    buf = shmbuf.EpisodeBuffer.attach(name)
    w = buf.writer()
    for t in range(steps):
        w.add({"obs": [t], "reward": 1.0}, terminated=False, truncated=False)
    hang_at("writing", flag)
    w.add({"obs": [steps], "reward": 1.0}, terminated=False, truncated=False)


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


def write_rows_then_hang(name: str, rows: int, flag: str) -> None:
    """Add ``rows`` rows (x = 0, 1, ...) one at a time, then stop forever inside the
    next write (at "writing"), touching ``flag`` there."""
    buf = shmbuf.Buffer.attach(name)
    for x in range(rows):
        buf.add({"x": x})
    hang_at("writing", flag)
    buf.add({"x": rows})
