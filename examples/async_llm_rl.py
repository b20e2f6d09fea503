"""Asynchronous RL for an LLM, without the LLM: generators and a trainer share a queue of
token rollouts of any length.

Two generator processes play the inference engine: each pulls the newest policy from
``shmbuf.Weights`` and writes rollouts (a prompt of 16 to 256 tokens, a response of 1 to
1,024, a log-probability per response token, a reward) into a ``shmbuf.Buffer`` in queue
mode with ragged fields, each row stamped with the policy version it was generated
with; the 4 rollouts of one write answer one prompt (a GRPO group). No padding, no
pickling: the tokens go straight into shared memory. The trainer takes batches by token budget, ``take(64, partial=True, max_tokens=8192, length="R",
max_staleness=2, groups=True)`` (the oldest rollouts, each delivered once, up to 8,192
response tokens, none more than 2 versions behind the policy it trains, groups whole),
computes each rollout's advantage against its group's mean reward, splits each into two
micro-batches of even token counts, turns them into torch jagged nested tensors
(``Jagged.to_torch()``, no copy; numpy padded batches where torch is missing), makes a
toy policy-gradient update of a per-token bias, and publishes the next version.

The tokens are not random: every value of a rollout is derived from (generator, row),
so the trainer checks every token, logprob and reward it takes, and that each rollout
came exactly once, in its generator's order. It prints the tokens taken per second, the
rows taken, and the staleness seen (never more than 2).

    pip install -e .                              # torch is optional: pip install torch==2.13.0
    python examples/async_llm_rl.py               # a few seconds
    python examples/async_llm_rl.py --seconds 30
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time

import numpy as np

import shmbuf
from shmbuf.ragged import batches
from shmbuf import Jagged

VOCAB = 32_000
PROMPT, RESPONSE = (16, 256), (1, 1024)  # token lengths, inclusive
FIELDS = {"prompt": ((None,), np.int32),  # ragged: its own length
          "response": (("R",), np.int32),  # ragged: length "R", shared with logprobs
          "logprobs": (("R",), np.float32),
          "reward": ((), np.float32), "generator": ((), np.int32), "row": ((), np.int64)}
GENERATORS, PER_WRITE, ROWS_PER_LANE = 2, 4, 16  # a lane per generator; rollouts per extend
TAKE, MAX_TOKENS, MAX_STALENESS, MICRO_BATCHES, LR = 64, 8192, 2, 2, 1e-3
# arena=: the rows kept times their mean bytes (each ragged field padded to 8 bytes), with slack
MEAN_BYTES = 4 * sum(PROMPT) // 2 + (4 + 4) * sum(RESPONSE) // 2
ARENA = GENERATORS * ROWS_PER_LANE * MEAN_BYTES * 5 // 4


def mix(g: int, rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of (generator, row) (splitmix64's finaliser), one per row."""
    z = rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64((g * 0xD1B54A32D192ED03 + 1) % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def spec(g: int, rows: np.ndarray) -> dict[str, np.ndarray]:
    """What rollouts ``rows`` of generator ``g`` hold: their lengths, the first token of
    the prompt and of the response (token i of each: (first + i) % VOCAB), the reward.
    The ``PER_WRITE`` rollouts of one write are a GRPO group: responses to one prompt."""
    h, p = mix(g, rows), mix(g, rows // PER_WRITE)  # (the prompt: the group's)
    field = lambda h, shift, n: ((h >> np.uint64(shift)) % np.uint64(n)).astype(np.int64)  # noqa: E731
    return {"prompt_len": PROMPT[0] + field(p, 0, PROMPT[1] - PROMPT[0] + 1),
            "response_len": RESPONSE[0] + field(h, 10, RESPONSE[1] - RESPONSE[0] + 1),
            "prompt_first": field(p, 22, VOCAB), "response_first": field(h, 38, VOCAB),
            "reward": (field(h, 54, 1000) / 1000).astype(np.float32)}


def logprob(tokens: np.ndarray) -> np.ndarray:
    """Each response token's "log-probability" (exact in float32)."""
    return -(tokens % 97).astype(np.float32) / 16


def rollouts(g: int, rows: np.ndarray) -> dict:
    """Generator ``g``'s rollouts ``rows``, as ``extend`` takes them: a list of arrays per
    ragged field."""
    s = spec(g, rows)
    prompts = [((f + np.arange(n)) % VOCAB).astype(np.int32) for f, n in zip(s["prompt_first"], s["prompt_len"])]
    responses = [((f + np.arange(n)) % VOCAB).astype(np.int32) for f, n in zip(s["response_first"], s["response_len"])]
    return {"prompt": prompts, "response": responses, "logprobs": [logprob(r) for r in responses],
            "reward": s["reward"], "generator": np.full(len(rows), g, np.int32), "row": rows}


def generator(queue_name: str, weights_name: str, g: int, stop, written) -> None:
    """A generator process: rollouts with the newest policy, written into lane ``g``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a Ctrl-C stops the trainer, which stops us)
    parent = os.getppid()
    q = shmbuf.Buffer.attach(queue_name)
    weights = shmbuf.Weights.attach(weights_name)
    version, row = 0, 0
    try:
        while not stop.is_set() and os.getppid() == parent:
            got = weights.read(newer_than=version)  # the newest policy, if there is a newer one
            if got is not None:
                version, _bias = got  # (a real generator would load _bias into its model here)
            batch = rollouts(g, np.arange(row, row + PER_WRITE))
            while True:
                try:  # all the rows or none; waits while the queue has no room (rows or bytes)
                    q.extend(batch, lane=g, version=version, timeout=0.5)
                    break
                except shmbuf.WriteTimeout:
                    if stop.is_set() or os.getppid() != parent:
                        return
            row += PER_WRITE
            written.value = row
    finally:
        weights.close()
        q.close()


def check(b: dict) -> int:
    """Every token, logprob, length and reward of a batch is the one its (generator,
    row) gives; returns the tokens checked."""
    n = len(b["row"])
    want = {k: np.zeros(n, v.dtype) for k, v in spec(0, np.zeros(1, np.int64)).items()}
    for g in np.unique(b["generator"]).tolist():
        mine = b["generator"] == g
        for k, v in spec(g, b["row"][mine]).items():
            want[k][mine] = v
    tokens = 0
    for name in ("prompt", "response"):
        j: Jagged = b[name]
        lengths = j.lengths
        assert (lengths == want[f"{name}_len"]).all(), f"{name}: wrong lengths"
        within = np.arange(len(j.values)) - np.repeat(j.offsets[:-1], lengths)
        assert (j.values == (np.repeat(want[f"{name}_first"], lengths) + within) % VOCAB).all(), f"{name}: wrong tokens"
        tokens += len(j.values)
    assert (b["logprobs"].offsets == b["response"].offsets).all()
    assert (b["logprobs"].values == logprob(b["response"].values)).all(), "wrong logprobs"
    assert (b["reward"] == want["reward"]).all(), "wrong rewards"
    return tokens


def advantages(b: dict) -> np.ndarray:
    """GRPO's: each rollout's reward less the mean reward of its group (the rollouts of
    one write: one prompt's responses; a take with ``groups=True`` never splits one)."""
    _, group = np.unique(b["generator"].astype(np.int64) << 40 | b["row"] // PER_WRITE, return_inverse=True)
    counts = np.bincount(group)
    assert (counts == PER_WRITE).all(), "a group split over two takes"
    return (b["reward"] - (np.bincount(group, b["reward"]) / counts)[group]).astype(np.float32)


def update(bias, part: dict, torch) -> float:
    """A toy policy-gradient step on one micro-batch: each response token's bias moves by
    its rollout's advantage; returns the surrogate loss. With torch, through jagged
    nested tensors; without, through padded numpy arrays and their mask."""
    adv = part["advantage"]
    if torch is not None:
        response = part["response"].to_torch()  # (rows, j1): a jagged nested tensor, no copy
        logprobs = part["logprobs"].to_torch()
        assert response.values().data_ptr() == part["response"].values.ctypes.data
        adv_t = torch.from_numpy(adv)
        loss = -(logprobs.sum(dim=1) * adv_t).sum() / logprobs.values().numel()
        per_token = torch.repeat_interleave(adv_t, torch.from_numpy(part["response"].lengths))
        bias.index_add_(0, response.values().long(), LR * per_token)
        return float(loss)
    response = part["response"].padded(multiple=64)  # (rows, L): L a multiple of 64
    mask = part["response"].mask(multiple=64)
    logprobs = part["logprobs"].padded(multiple=64)
    loss = -((logprobs * mask).sum(1) * adv).sum() / mask.sum()
    np.add.at(bias, response[mask], LR * np.broadcast_to(adv[:, None], mask.shape)[mask])
    return float(loss)


def train(seconds: float = 3.0, use_torch: bool | None = None, min_takes: int = 2) -> dict:
    """Run the generators and the trainer for ``seconds`` from the first rollouts taken
    (and at least ``min_takes`` takes); returns what was taken and checked (tokens/s:
    those of the takes after the first, over the time since it). ``use_torch``: None
    uses torch where it is installed, False never."""
    torch = None
    if use_torch is not False:
        try:
            import torch
        except ImportError:
            if use_torch:
                raise
    if torch is not None:
        torch.set_num_threads(1)  # (the generators have the other cores)
        Jagged.from_rows([[0]]).to_torch()  # (torch's first nested tensor imports more of torch: seconds)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    written = [ctx.Value("q", 0, lock=False) for _ in range(GENERATORS)]
    bias = torch.zeros(VOCAB) if torch is not None else np.zeros(VOCAB, np.float32)
    seen = [[] for _ in range(GENERATORS)]  # the rows taken, per generator, in order
    stale, tokens, timed, takes, losses = [], 0, 0, 0, []
    with shmbuf.Buffer.create(FIELDS, GENERATORS * ROWS_PER_LANE, lanes=GENERATORS, mode="queue",
                              versions=True, arena=ARENA) as q, \
            shmbuf.Weights.create(f"{q.name}-policy", {"bias": np.zeros(VOCAB, np.float32)}) as weights:
        weights.publish({"bias": bias})  # version 1
        q.bind(weights)  # max_staleness counts from the weights' latest version
        procs = [ctx.Process(target=generator, args=(q.name, weights.name, g, stop, written[g]), daemon=True)
                 for g in range(GENERATORS)]
        for p in procs:
            p.start()
        t0 = None  # (the clock starts at the first rollouts: the generators have started)
        try:
            while t0 is None or time.monotonic() - t0 < seconds or takes < min_takes:
                b = q.take(TAKE, partial=True, max_tokens=MAX_TOKENS, length="R",
                           max_staleness=MAX_STALENESS, groups=True, timeout=60)
                stale.append(weights.version - b["version"])  # versions behind the policy trained
                checked = check(b)
                tokens += checked
                timed += checked if t0 is not None else 0
                for g in range(GENERATORS):
                    seen[g] += b["row"][b["generator"] == g].tolist()
                b["advantage"] = advantages(b)
                for positions in batches.balanced(b["response"].lengths, MICRO_BATCHES):
                    if len(positions):
                        losses.append(update(bias, batches.select(b, positions), torch))
                weights.publish({"bias": bias})  # the next version
                takes += 1
                t0 = time.monotonic() if t0 is None else t0
            elapsed = time.monotonic() - t0
        finally:
            stop.set()
            for p in procs:
                p.join(30)
        # the rows left in the queue, to account for every row written
        left = q.take(sys.maxsize, partial=True, timeout=0.1) if len(q) else {"row": np.zeros(0, np.int64)}
        stats = q.stats()
    stale = np.concatenate(stale)
    for g in range(GENERATORS):  # each rollout once, in its generator's order
        assert seen[g] == sorted(set(seen[g])), f"generator {g}: a row taken twice, or out of order"
    total = sum(w.value for w in written)
    assert stats["rows_taken"] == len(stale) + len(left["row"])
    assert len(stale) + stats["rows_stale"] + len(left["row"]) == total, "a row was lost"
    return {"takes": takes, "rows_taken": len(stale), "rows_stale": int(stats["rows_stale"]),
            "rows_written": total, "tokens": tokens, "tokens_per_s": timed / max(elapsed, 1e-9),
            "seconds": elapsed, "staleness": stale, "losses": losses, "torch": torch is not None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--no-torch", action="store_true", help="numpy padded batches even where torch is installed")
    args = ap.parse_args()
    use_torch = False if args.no_torch else None
    if use_torch is None:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not installed: the trainer uses numpy padded batches (pip install torch==2.13.0)")
    try:
        got = train(args.seconds, use_torch)
    except KeyboardInterrupt:
        print("interrupted: the generators stopped and the queue was removed")
        raise SystemExit(130)
    s = got["staleness"]
    print(f"{got['takes']} takes of up to {MAX_TOKENS} response tokens ("
          + ("torch jagged nested tensors" if got["torch"] else "numpy padded batches") + "): "
          f"{got['rows_taken']} rollouts, {got['tokens']:,} tokens (prompts and responses), "
          f"{got['tokens_per_s']:,.0f} tokens/s over {got['seconds']:.1f} s")
    print(f"staleness of the rollouts taken: mean {s.mean():.2f}, max {s.max()} (limit {MAX_STALENESS}); "
          f"{got['rows_stale']} passed over as stale, of {got['rows_written']} written")
    print(f"verified: every token, logprob and reward of {got['rows_taken']} rollouts; each taken once, in order")


if __name__ == "__main__":
    main()
