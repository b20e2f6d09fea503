"""``scripts/bench-ragged``: an LLM's RL loop (GRPO-shaped rollouts) from two generator
processes to one trainer, through shmbuf's queue and the transports LLM RL frameworks
use, side by side, in one run.

The rollouts (those of :mod:`benchmarks.ragged`, every value derived from the rollout's
id): a prompt of 64..1,024 int32 tokens, a response of 1..8,192 with a float32 logprob
and a uint8 mask per token, a float32 reward, the policy version the generator saw (the
trainer publishes one after each batch, through a shared int64 every arm reads), the
time it was made, and an infos dict (``finish_reason``, ``env``: derived from the id).
The trainer takes batches of at most 65,536 response tokens of rows at most 2 versions
behind (``max_staleness=2``), verifies every token (:func:`benchmarks.ragged.verify`;
versions within the bound, infos, each generator's rows in order, none twice), turns
each batch into torch jagged nested tensors (``torch.nested.nested_tensor_from_jagged``)
and publishes the next version.

The arms (each with its batching knobs; the best knob is the one compared):

* shmbuf: a ``mode="queue", versions=True`` buffer with ragged fields;
  ``take(max_tokens=65536, length="R", version=v, max_staleness=2)`` passes over stale
  rows itself (counted in ``stats()["rows_stale"]``); the infos as two uint8 codes.
* ``multiprocessing.Queue`` and ``torch.multiprocessing.Queue`` (tensors in shared
  memory): one rollout or a list of 16 a put.
* Ray, verl's fully-async pattern: ``ray.put`` of each rollout (or a list of 16) and an
  actor holding a deque of the refs (verl's ``MessageQueue``); the trainer asks the
  actor for refs and ``ray.get``s them.
* Ray, OpenRLHF's: ``ray.util.queue.Queue`` (an actor) of rollouts or lists of them.
* Arrow IPC files in /dev/shm: a generator writes a batch of rollouts (list<int32>...
  columns) to a file and passes its name through a ``multiprocessing.Queue``; the
  trainer memory-maps it (the values and offsets are Arrow's: no copy) and deletes it.
* TorchRL's ``RayReplayBuffer(storage=LazyStackStorage)`` (TorchRL's GRPO-async
  recipe): generators ``extend`` TensorDicts of rollouts, the trainer ``sample``s. A
  replay buffer: rows may be drawn twice or never; its tokens are counted as drawn.
* the floor: :class:`benchmarks.ragged.FloorArm`, each writer memcpys the same bytes
  into its own ring in one shared-memory block, the trainer memcpys them out (its
  versions are the ids' ``>> 10``: no staleness bound, no jagged tensors, no infos).

Arms that cannot bound staleness themselves drop the stale rollouts in the trainer
(reported: ``stale dropped``). Reported per arm: verified tokens/s, the trainer's CPU
seconds per million tokens, the age of a row when taken (p50/p99 in seconds and in
versions), the share of rollouts passed over as stale, ratios to shmbuf.

Generators of the Ray arms are Ray actors (as verl's and OpenRLHF's are) of one local
Ray cluster this run starts (and shuts down, killing what is left of it, at the end).

    python -m benchmarks.llm --quick        # 2 s windows, one round, one knob each
    python -m benchmarks.llm                # 5 s windows, 3 rounds, interleaved, all knobs
"""

from __future__ import annotations

import argparse
import glob
import os
import warnings
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

from benchmarks import ragged as R

BUDGET, STALENESS, LIST = R.BUDGET, 2, R.LIST
FINISH = ("stop", "length")
ENVS = ("gsm8k", "math", "code", "chat")
SHM = "/dev/shm"
PREFIX = "shmbuf-bench-llm"


def infos(row: int) -> dict[str, str]:
    """A rollout's infos dict, from its id."""
    return {"finish_reason": FINISH[R._lengths(row)[1] == R.RESPONSE[1]], "env": ENVS[row % len(ENVS)]}


def infos_codes(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(finish_reason, env) codes of ``rows`` (what :func:`infos` names)."""
    return (R.lengths(rows)[1] == R.RESPONSE[1]).astype(np.uint8), (rows % len(ENVS)).astype(np.uint8)


# -- the version the trainer publishes, and the generators' stop flag ------------------------

class Control:
    """Two int64s in a file of /dev/shm: [0] the policy version the trainer published,
    [1] stop. Any process maps it by name (pickled as its name; no resource tracker)."""

    def __init__(self, name: str, create: bool = False) -> None:
        self.name = name
        path = os.path.join(SHM, name)
        if create:
            with open(path, "wb") as f:
                f.write(bytes(64))
        self.a = np.memmap(path, np.int64, mode="r+", shape=(8,))

    def __reduce__(self) -> Any:
        return Control, (self.name,)

    @property
    def version(self) -> int:
        return int(self.a[0])

    def publish(self, v: int) -> None:
        self.a[0] = v

    def is_set(self) -> bool:
        return bool(self.a[1])

    def set(self) -> None:
        self.a[1] = 1

    def unlink(self) -> None:
        try:
            os.unlink(os.path.join(SHM, self.name))
        except FileNotFoundError:
            pass


class LLM:
    """What every arm of this run adds to a :class:`benchmarks.ragged.Arm`: rollouts
    stamped with the published version, their time and infos; the trainer's staleness
    filter (where the transport has none), verification, jagged tensors, next version."""

    native_staleness = False  # the transport passes over stale rows itself
    ordered = True  # a generator's rows come in order, each once (False: a replay buffer's draws)
    control: Control
    system = "?"
    knob = "?"

    def stop_event(self) -> Any:
        self.control = Control(f"{PREFIX}-{os.getpid()}-{id(self):x}", create=True)
        self._reset()
        return self.control

    def _reset(self) -> None:
        self.dropped = self.kept = self.stale0 = 0
        self.ages_s: list[float] = []
        self.ages_v: list[int] = []
        self.torch = None

    def meta(self, row: int) -> dict[str, Any]:
        return {"version": self.control.version, "t": time.monotonic(), "infos": infos(row)}

    def keep(self, item: dict[str, Any]) -> bool:
        if self.control.version - item["version"] > STALENESS:
            self.dropped += 1
            return False
        return True

    def check(self, b: R.Batch, due: list[int]) -> int:
        v = self.control.version
        rows = np.asarray(b["row"], np.int64)
        if "infos" in b:
            want = [infos(r) for r in rows.tolist()]
            if b["infos"] != want:
                raise R.Mismatch("an infos dict differs")
        else:
            f, e = infos_codes(rows)
            if not (np.array_equal(b["finish"], f) and np.array_equal(b["env"], e)):
                raise R.Mismatch("an infos code differs")
        t = np.asarray(b["t"], np.float64)
        now = time.monotonic()
        if not (t <= now).all():
            raise R.Mismatch("a rollout made after it was taken")
        self.ages_s.extend((now - t).tolist())
        self.ages_v.extend((v - np.asarray(b["version"])).tolist())
        self.kept += len(rows)
        return R.verify(b, due if self.ordered else None, self.generators, (v - STALENESS, v), gaps=True)

    def after(self, b: R.Batch) -> None:
        if self.torch is None:
            try:
                import torch
                torch.set_num_threads(1)
                self.torch = torch
            except ImportError:
                self.torch = False
        if self.torch:
            torch = self.torch
            with warnings.catch_warnings():  # (an Arrow batch's memory is read-only: torch says so; nobody writes)
                warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
                self.jagged = self._jagged(torch, b)
        self.control.publish(self.control.version + 1)  # the update: the next policy

    @staticmethod
    def _jagged(torch: Any, b: dict[str, Any]) -> dict[str, Any]:
        """The batch's ragged fields as torch jagged nested tensors over its memory."""
        off = {"prompt": torch.from_numpy(np.asarray(b["prompt_offsets"], np.int64)),
               "response": torch.from_numpy(np.asarray(b["response_offsets"], np.int64))}
        return {k: torch.nested.nested_tensor_from_jagged(torch.from_numpy(np.asarray(b[k])),
                                                          off["prompt" if k == "prompt" else "response"])
                for k in ("prompt", "response", "logprobs", "mask")}

    def measure(self) -> None:
        """The window begins: its figures only from here."""
        self.ages_s.clear()
        self.ages_v.clear()
        self.kept, self.stale0 = 0, self.stale()

    def stale(self) -> int:
        return self.dropped

    def report(self) -> dict[str, Any]:
        q = lambda a, p: float(np.percentile(a, p)) if len(a) else None  # noqa: E731
        stale = self.stale() - self.stale0
        return {"age s p50": q(self.ages_s, 50), "age s p99": q(self.ages_s, 99),
                "age versions p50": q(self.ages_v, 50), "age versions p99": q(self.ages_v, 99),
                "age versions max": max(self.ages_v, default=None), "stale": stale, "kept": self.kept,
                "stale share": stale / max(stale + self.kept, 1), "jagged": bool(self.torch)}


# -- shmbuf and the multiprocessing queues -------------------------------------------------

FIELDS = {**{k: v for k, v in R.RAGGED_FIELDS.items() if k != "version"},  # (versions=True keeps it)
          "t": ((), np.float64), "finish": ((), np.uint8), "env": ((), np.uint8)}


class Shmbuf(LLM, R.ShmbufArm):
    native_staleness = True
    system = "shmbuf queue"

    def __init__(self, per: int, arena: int) -> None:
        R.ShmbufArm.__init__(self, per)
        self.arena = arena
        self.knob = f"extend of {per} rollout{'s' * (per > 1)}, arena {arena >> 20} MiB"
        self.name = f"{self.system}, {self.knob}"

    def open(self) -> None:
        self.buf = self.create(self.CAPACITY, self.arena, self.generators, FIELDS, versions=True)

    def extend(self, rows: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        batch = R.extend_args(rows)
        ids = batch["row"]
        f, e = infos_codes(ids)
        v = self.control.version
        batch.pop("version")
        return {**batch, "t": np.full(len(ids), time.monotonic()), "finish": f, "env": e}, {"version": v}

    def take_args(self) -> dict[str, Any]:
        return {"version": self.control.version, "max_staleness": STALENESS}

    def batches(self) -> Callable[[], R.Batch]:
        nxt = R.ShmbufArm.batches(self)
        import shmbuf
        self.q = shmbuf.Buffer.attach(self.buf.name)
        return nxt

    def stale(self) -> int:
        return int(self.q.stats()["rows_stale"])


class Queue(LLM, R.QueueArm):
    def __init__(self, knob: str, torch: bool = False) -> None:
        R.QueueArm.__init__(self, knob, torch)  # (self.knob: "one" or "list", as QueueArm's loops read it)


# -- Ray ---------------------------------------------------------------------------------------

class RayCluster:
    """One local Ray cluster for the run, held by a child process (no process that forks
    runs Ray); its temporary folder names its processes, killed at the end if left."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="rb-")  # (short: Ray's socket paths have a length limit)
        code = ("import ray, sys; c = ray.init(num_cpus=8, object_store_memory=512 << 20, include_dashboard=False, "
                f"_temp_dir={self.tmp!r}, logging_level='ERROR', log_to_driver=False); "
                "print(c.address_info['gcs_address'], flush=True); sys.stdin.read(); ray.shutdown()")
        env = {**os.environ, **RAY_ENV, MARK: self.tmp}
        self.proc = subprocess.Popen([sys.executable, "-W", "ignore", "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.address = (self.proc.stdout.readline() or "").strip()
        if not self.address:
            self.close()
            raise RuntimeError("the Ray cluster did not start")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(60)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        for pid in _pids_with(self.tmp):  # what Ray left (its processes name the folder)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


# a local cluster, its drivers and its actors on this machine, for the run's minutes: no
# token (the drivers would need the cluster's), no usage reports
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
MARK = "SHMBUF_BENCH_LLM_RAY"  # in the environment of the cluster's processes: its folder


def _pids_with(text: str) -> list[int]:
    """The processes whose environment holds ``MARK=text`` (the Ray cluster's, all of it)."""
    out = []
    want = f"{MARK}={text}\0".encode()
    for d in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(d, "rb") as f:
                if want in f.read() + b"\0":
                    out.append(int(d.split("/")[2]))
        except OSError:
            pass
    return [p for p in out if p != os.getpid()]


class RayArm(LLM, R.Arm):
    """An arm whose generators are Ray actors started by the trainer (the driver)."""

    forks = 0
    address = ""

    def _connect(self) -> Any:
        import ray
        if not ray.is_initialized():
            os.environ.update(RAY_ENV)
            ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
        return ray

    def start_generators(self) -> None:
        ray = self._connect()

        @ray.remote(num_cpus=0)
        class Generator:
            def run(self, arm: Any, g: int) -> None:
                arm.generate(g, arm.control)

        self.gens = [Generator.remote() for _ in range(self.generators)]
        self.runs = [a.run.remote(self, g) for g, a in enumerate(self.gens)]

    def check_generators(self) -> None:
        """Raise a generator actor's error, if one ended with one."""
        import ray
        done, _ = ray.wait(self.runs, timeout=0)
        if done:
            ray.get(done)
            raise RuntimeError("a generator actor ended")

    def close(self) -> None:
        pass  # (the trainer's process ends, its driver with it; the cluster outlives it)


class _RefQueue:
    """verl's ``MessageQueue``, as an actor: a deque of rollouts (here: refs to them)."""

    def __init__(self, maxsize: int) -> None:
        import asyncio
        import collections
        self.q: Any = collections.deque()
        self.maxsize = maxsize
        self.cond = asyncio.Condition()

    async def put(self, refs: list, timeout: float) -> bool:
        async with self.cond:
            try:
                import asyncio
                await asyncio.wait_for(self.cond.wait_for(lambda: len(self.q) < self.maxsize), timeout)
            except Exception:
                return False
            self.q.append(refs[0])
            self.cond.notify_all()
            return True

    async def get(self, timeout: float, block: bool) -> list:
        async with self.cond:
            if block:
                try:
                    import asyncio
                    await asyncio.wait_for(self.cond.wait_for(lambda: len(self.q) > 0), timeout)
                except Exception:
                    return []
            if not self.q:
                return []
            ref = self.q.popleft()
            self.cond.notify_all()
            return [ref]


class _Refs:
    """The generators' and the trainer's side of verl's pattern, with a queue's
    ``put(item, timeout=)``, ``get(timeout=)`` and ``get_nowait()``."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def put(self, item: Any, timeout: float) -> None:
        import queue

        import ray
        ref = ray.put(item)
        if not ray.get(self.actor.put.remote([ref], timeout)):
            raise queue.Full

    def _get(self, timeout: float, block: bool) -> Any:
        import queue

        import ray
        got = ray.get(self.actor.get.remote(timeout, block))
        if not got:
            raise queue.Empty
        return ray.get(got[0])

    def get(self, timeout: float) -> Any:
        return self._get(timeout, True)

    def get_nowait(self) -> Any:
        return self._get(0.0, False)


class RayQueue(RayArm, Queue):
    """verl's ("refs": ``ray.put`` + an actor's deque of refs) or OpenRLHF's
    (``ray.util.queue.Queue``) pattern, with :class:`benchmarks.ragged.QueueArm`'s loops."""

    KNOBS = {"one": "1 rollout a put", "list": f"a list of {LIST} rollouts a put"}

    def __init__(self, kind: str, knob: str) -> None:
        Queue.__init__(self, knob)
        self.kind = kind
        self.system = ("Ray: ray.put + an actor's deque of refs (verl)" if kind == "refs"
                       else "Ray: ray.util.queue.Queue (OpenRLHF)")
        self.name = f"{self.system}, {self.KNOBS[knob]}"

    def open(self) -> None:
        pass

    def batches(self) -> Callable[[], R.Batch]:
        ray = self._connect()
        size = {"one": 64, "list": 4}[self.knob]
        if self.kind == "refs":
            self.q = _Refs(ray.remote(num_cpus=0)(_RefQueue).remote(size))
        else:
            from ray.util.queue import Queue as RQ
            self.q = RQ(maxsize=size, actor_options={"num_cpus": 0})
        self.start_generators()
        return R.QueueArm.batches(self)


class TorchRL(RayArm):
    """TorchRL's ``RayReplayBuffer(storage=LazyStackStorage)`` (its GRPO-async recipe's)."""

    ordered = False
    startup = 150.0
    system = "TorchRL RayReplayBuffer(LazyStackStorage)"

    def __init__(self, per: int, draw: int) -> None:
        self.per, self.draw = per, draw
        self.knob = f"extend of {per}, sample({draw})"
        self.name = f"{self.system}, {self.knob}"

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "rb"}

    def generate(self, g: int, stop: Any) -> None:
        import torch
        from tensordict import TensorDict, lazy_stack
        torch.set_num_threads(1)
        row, step = g, self.generators
        while not stop.is_set():
            tds = []
            for _ in range(self.per):
                r = R.rollout(row)
                m = self.meta(row)
                tds.append(TensorDict({k: torch.from_numpy(r[k]) for k in ("prompt", "response", "logprobs", "mask")}
                                      | {"row": torch.tensor(row), "version": torch.tensor(m["version"]),
                                         "reward": torch.tensor(r["reward"]), "t": torch.tensor(m["t"], dtype=torch.float64),
                                         "finish": torch.tensor(FINISH.index(m["infos"]["finish_reason"]), dtype=torch.uint8),
                                         "env": torch.tensor(ENVS.index(m["infos"]["env"]), dtype=torch.uint8)}))
                row += step
            self.client.extend(lazy_stack(tds))

    def batches(self) -> Callable[[], R.Batch]:
        self._connect()
        from functools import partial

        from torchrl.data import LazyStackStorage
        from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer
        self.rb = RayReplayBuffer(storage=partial(LazyStackStorage, 64), batch_size=self.draw,
                                  remote_config={"num_cpus": 0})
        self.client = self.rb.client()  # (the generators': picklable)
        self.start_generators()
        deadline = time.monotonic() + self.startup  # (three new processes import torch: slow on 2 busy cores)
        while len(self.rb) < self.draw:
            self.check_generators()
            if time.monotonic() > deadline:
                raise TimeoutError("TorchRL's buffer got no rollouts")
            time.sleep(0.01)

        def batch() -> R.Batch:
            while True:
                td = self.rb.sample()
                items = [{k: v.numpy() for k, v in t.items()} for t in td.unbind(0)]
                items = [it for it in items if self.keep({"version": int(it["version"])})]
                if not items:
                    continue
                out, tokens = [], 0
                for it in items:
                    if out and tokens + len(it["response"]) > BUDGET:
                        break
                    out.append(it)
                    tokens += len(it["response"])
                b = R.collate([{**it, "row": int(it["row"]), "version": int(it["version"])} for it in out])
                for k in ("t", "finish", "env"):
                    b[k] = np.array(b[k])
                return b
        return batch


# -- Arrow IPC files in /dev/shm ----------------------------------------------------------------

class Arrow(LLM, R.Arm):
    """A generator writes a batch of rollouts (<= 65,536 response tokens, or ``per``
    rollouts) as an Arrow IPC file in /dev/shm, renames it into place and passes the
    name through a ``multiprocessing.Queue``; the trainer memory-maps it (Arrow's
    values and offsets, no copy), filters stale rows, and deletes it."""

    system = "Arrow IPC files in /dev/shm, by name"

    def __init__(self, per: int | None) -> None:
        self.per = per
        self.knob = f"a file of {per} rollouts" if per else f"a file per batch (<= {BUDGET:,} tokens)"
        self.name = f"{self.system}, {self.knob}"

    def open(self) -> None:
        self.q = R.CTX.Queue(4 if not self.per else max(4, 64 // self.per))
        self.prefix = os.path.join(SHM, f"{PREFIX}-{os.getpid()}-arrow-{id(self):x}")

    def generate(self, g: int, stop: Any) -> None:
        import pyarrow as pa
        self.q.cancel_join_thread()
        row, step, seq = g, self.generators, 0
        while not stop.is_set():
            if self.per:
                rows = list(range(row, row + step * self.per, step))
                nxt = row + step * self.per
            else:
                rows, nxt = R.packed_rows(row, step)
            items = [R.rollout(r) for r in rows]
            ms = [self.meta(r) for r in rows]
            col = lambda k, t: pa.ListArray.from_arrays(  # noqa: E731
                pa.array(R._offsets([len(it[k]) for it in items]).astype(np.int32)),
                pa.array(np.concatenate([it[k] for it in items]), t))
            table = pa.record_batch({
                "row": pa.array(rows, pa.int64()), "version": pa.array([m["version"] for m in ms], pa.int64()),
                "t": pa.array([m["t"] for m in ms], pa.float64()),
                "reward": pa.array([it["reward"] for it in items], pa.float32()),
                "prompt": col("prompt", pa.int32()), "response": col("response", pa.int32()),
                "logprobs": col("logprobs", pa.float32()), "mask": col("mask", pa.uint8()),
                "infos": pa.array([m["infos"] for m in ms])})
            path = f"{self.prefix}-{g}-{seq}.arrow"
            with pa.OSFile(path + ".tmp", "wb") as f, pa.ipc.new_file(f, table.schema) as w:
                w.write_batch(table)
            os.rename(path + ".tmp", path)
            seq += 1
            while not stop.is_set():
                try:
                    self.q.put(path, timeout=0.2)
                    row = nxt
                    break
                except Exception:
                    continue

    def batches(self) -> Callable[[], R.Batch]:
        import pyarrow as pa
        import pyarrow.compute as pc

        def batch() -> R.Batch:
            while True:
                path = self.q.get(timeout=R.TIMEOUT)
                self.src = src = pa.memory_map(path)  # (kept open while the batch is used: until the next)
                t = pa.ipc.open_file(src).get_batch(0)
                os.unlink(path)  # (the mapping stays valid after)
                fresh = pc.greater_equal(t.column("version"), self.control.version - STALENESS)
                n = len(t)
                kept = pc.sum(fresh).as_py() or 0
                if kept < n:
                    self.dropped += n - kept
                    if not kept:
                        continue
                    t = t.filter(fresh)  # (a copy of what is kept)
                break
            out: dict[str, Any] = {"row": t.column("row").to_numpy(), "version": t.column("version").to_numpy(),
                                   "t": t.column("t").to_numpy(), "reward": t.column("reward").to_numpy(),
                                   "infos": t.column("infos").to_pylist()}
            for k in ("prompt", "response", "logprobs", "mask"):
                c = t.column(k)
                o = c.offsets.to_numpy().astype(np.int64)
                out[k] = c.values.to_numpy()[o[0]:o[-1]]
                if k in ("prompt", "response"):
                    out[f"{k}_offsets"] = o - o[0]
            return out
        return batch

    def close(self) -> None:
        self.q.close()
        for p in glob.glob(self.prefix + "-*"):
            os.unlink(p)


# -- the run ----------------------------------------------------------------------------------------

def arms(quick: bool, have: dict[str, bool]) -> list[R.Arm]:
    """Every arm with each of its knobs (quick: the knob each does best with here)."""
    out: list[R.Arm] = [Shmbuf(LIST, 4 << 20)] + ([] if quick else [Shmbuf(LIST, 8 << 20), Shmbuf(4, 4 << 20)])
    out += [Queue("list")] + ([] if quick else [Queue("one")])
    if have["torch"]:
        out += [Queue("list", torch=True)] + ([] if quick else [Queue("one", torch=True)])
    if have["ray"]:
        for kind in ("refs", "queue"):
            out += [RayQueue(kind, "list")] + ([] if quick else [RayQueue(kind, "one")])
    if have["pyarrow"]:
        out += [Arrow(None)] + ([] if quick else [Arrow(LIST)])
    if have["torchrl"]:
        out += [TorchRL(LIST, LIST)]  # (one knob: its actors' start takes minutes on 2 busy cores)
    return out + [R.FloorArm(True)]


def available() -> dict[str, bool]:
    """The packages installed (by their distributions: the tests' folder ``ray`` is not Ray)."""
    from importlib import metadata

    def has(d: str) -> bool:
        try:
            metadata.version(d)
            return True
        except metadata.PackageNotFoundError:
            return False
    got = {m: has(m) for m in ("torch", "ray", "pyarrow", "torchrl")}
    return {**got, "torchrl": got["torchrl"] and got["ray"]}


def _leftovers() -> list[str]:
    """This run's files left in /dev/shm (their names start with its process id)."""
    return sorted(glob.glob(os.path.join(SHM, f"{PREFIX}-{os.getpid()}-*")))


def run(quick: bool = False, window: float | None = None, rounds: int | None = None, only: list[str] | None = None,
        progress: bool = True) -> dict[str, Any]:
    from benchmarks.run import machine

    seconds = window if window is not None else (2.0 if quick else 5.0)
    rounds = rounds if rounds is not None else (1 if quick else 3)
    warmup = min(1.0, seconds / 3)
    have = available()
    systems = [a for a in arms(quick, have) if not only or any(o.lower() in a.name.lower() for o in only)]
    res: dict[str, Any] = {"kind": "llm", "machine": machine(), "available": have,
                           "config": {"quick": quick, "window s": seconds, "rounds": rounds, "warmup s": warmup,
                                      "budget tokens": BUDGET, "max staleness": STALENESS},
                           "systems": {a.name: getattr(a, "system", a.name.split(":")[0]) for a in systems},
                           "arms": {a.name: [] for a in systems}}
    if have["torch"]:
        import torch  # noqa: F401  (imported once here, not in each forked trainer; nothing runs before the forks)
    if have["pyarrow"]:
        import pyarrow  # noqa: F401
    cluster = RayCluster() if any(isinstance(a, RayArm) for a in systems) else None
    try:
        for a in systems:
            if isinstance(a, RayArm):
                a.address = cluster.address
        for rnd in range(rounds):  # interleaved: A B C ... A B C ...
            for a in systems:
                if progress:
                    print(f"\r\033[K  llm round {rnd + 1}/{rounds}: {a.name}", end="", file=sys.stderr, flush=True)
                got = R.run_arm(a, warmup, seconds)
                if isinstance(a, LLM):
                    a.control.unlink()
                res["arms"][a.name].append(got)
    finally:
        if cluster:
            cluster.close()
    res["best"] = summary(res)["best"]  # (what the plot draws)
    res["left over"] = _leftovers() + (_pids_with(cluster.tmp) if cluster else [])
    if progress:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    return res


def summary(res: dict[str, Any]) -> dict[str, Any]:
    """Per system, its best knob by verified tokens/s (median of the rounds)."""
    rate = {n: R._median(runs, "tokens/s") for n, runs in res["arms"].items()}
    best: dict[str, str] = {}
    for n, v in rate.items():
        s = res["systems"][n]
        if v is not None and (s not in best or v > rate[best[s]]):
            best[s] = n
    return {"rate": rate, "best": best, "shmbuf": best.get("shmbuf queue")}


def markdown(res: dict[str, Any]) -> str:
    m, c = res["machine"], res["config"]
    sm = summary(res)
    rate, best = sm["rate"], sm["best"]
    base = rate.get(sm["shmbuf"]) if sm["shmbuf"] else None
    shm_cpu = R._median(res["arms"][sm["shmbuf"]], "cpu s per M tokens") if sm["shmbuf"] else None
    lines = [f"### LLM RL rollouts: {R.GENERATORS} generators -> 1 trainer, batches of <= {BUDGET:,} response "
             f"tokens, max_staleness={STALENESS}, every token verified, torch jagged tensors",
             "",
             f"{'quick' if c['quick'] else 'full'}: {c['rounds']} round(s) of {c['window s']:g} s windows (after "
             f"{c['warmup s']:g} s of warm-up), arms interleaved, medians; {m['cpus']} cores, Python {m['python']}, "
             f"numpy {m['numpy']}, torch {m['torch'] or 'not installed'}, shmbuf {m['shmbuf']}, {m['date']}. "
             "Age: from a rollout's making to its take, in seconds and in versions (the trainer publishes one "
             "a batch). Stale: rollouts passed over as more than 2 versions behind (shmbuf: by its take; "
             "the others: dropped by the trainer). CPU: the trainer's (user + system) per million verified "
             "tokens. Best knob of each system in bold; ratios are shmbuf's best over the row's.",
             "",
             "| system, knob | verified tokens/s | shmbuf / this | trainer CPU s per M tokens | CPU / shmbuf's "
             "| age p50 / p99 (s) | age p50 / p99 (versions) | stale |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, runs in res["arms"].items():
        v = rate.get(name)
        if v is None:
            err = next((r["error"] for r in runs if "error" in r), "?")
            lines.append(f"| {name} | **failed**: {err} | | | | | | |")
            continue
        md = lambda k: R._median([r for r in runs if r.get(k) is not None], k)  # noqa: E731
        cpu = md("cpu s per M tokens")
        bold = name in best.values()
        label = f"**{name}**" if bold else name
        fmt = lambda x, f: "-" if x is None else f.format(x)  # noqa: E731
        share = md("stale share")
        lines.append(f"| {label} | {v / 1e6:,.2f} M | {fmt(base / v if base else None, '{:.2f}')} | {cpu:.3f} | "
                     f"{fmt(cpu / shm_cpu if shm_cpu else None, '{:.2f}')} | "
                     f"{fmt(md('age s p50'), '{:.3f}')} / {fmt(md('age s p99'), '{:.3f}')} | "
                     f"{fmt(md('age versions p50'), '{:.0f}')} / {fmt(md('age versions p99'), '{:.0f}')} | "
                     f"{fmt(share, '{:.0%}')} |")
    have = res["available"]
    for mod, what in (("torch", "torch.multiprocessing.Queue"), ("ray", "the Ray arms"), ("pyarrow", "Arrow IPC"),
                      ("torchrl", "TorchRL RayReplayBuffer")):
        if not have.get(mod):
            lines.append(f"| {what} | not installed here (scripts/bench-ragged installs it) | | | | | | |")
    lines += ["", "Floor: the same bytes memcpy'd between processes (versions are the ids', no staleness "
              "bound, no infos, no jagged tensors: the copy and the verification only). TorchRL's buffer is "
              "a replay buffer: a row may be drawn twice or never; its tokens are counted as drawn."]
    if res.get("left over"):
        lines.append(f"\n**Left over after the run**: {res['left over']}")
    return "\n".join(lines)


def failed(res: dict[str, Any]) -> list[str]:
    return R.failed(res)


def save(res: dict[str, Any], folder: str = "results") -> str:
    return R.save(res, folder, "bench-llm", markdown)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench-ragged", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 s windows, one round, one knob a system")
    p.add_argument("--window", type=float, help="seconds per window")
    p.add_argument("--rounds", type=int)
    p.add_argument("--arms", help="comma-separated parts of the arms' names to run (e.g. shmbuf,floor)")
    p.add_argument("--results", default="results", help="folder for the JSON and markdown files")
    a = p.parse_args(argv)
    res = run(a.quick, a.window, a.rounds, a.arms.split(",") if a.arms else None)
    print(markdown(res))
    print(f"\nsaved {save(res, a.results)}", file=sys.stderr)
    return 1 if failed(res) or res["left over"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
