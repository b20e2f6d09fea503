"""Asynchronous DQN on CartPole: actor processes and a learner share one EpisodeBuffer.

Two actor processes step CartPole-v1 envs with an epsilon-greedy copy of the Q-network
and write every step into a shared ``shmbuf.EpisodeBuffer`` (one lane per env, no
queue, no pickling); they pull the learner's newest weights from ``shmbuf.Weights``.
A ``shmbuf.RateLimit`` keeps the rows sampled per step written at the single-process
loop's ratio, so actors that run ahead wait and leave the CPU to the learner.
The learner samples batches through ``shmbuf.torch.TorchSampler`` (a background
thread) and trains. For comparison, ``--mode single`` runs the same DQN in one process
that alternates env steps and updates.

Install what it needs (torch first, pinned: its CPU build), then run::

    pip install torch==2.13.0
    pip install gymnasium matplotlib -e .
    python examples/async_dqn.py                 # both modes, then the plot
    python examples/async_dqn.py --mode async --seconds 120

It prints the time at which the return, averaged over the last 20 episodes, first
reached 475 (CartPole-v1's "solved" level is 475 of 500), and with both modes draws
``async_dqn.png`` (returns against wall-clock seconds).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import time

import numpy as np

import shmbuf

ENVS_PER_ACTOR = 4
FIELDS = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32)}
GAMMA, LR, BATCH, TARGET_EVERY, PUBLISH_EVERY = 0.99, 1e-3, 128, 250, 25
EPS_STEPS, EPS_END, LEARNING_STARTS = 20_000, 0.02, 2_000
SOLVED, WINDOW = 475.0, 20


def q_network():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(4, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 2))


def epsilon(steps: int) -> float:
    return max(EPS_END, 1.0 - (1.0 - EPS_END) * steps / EPS_STEPS)


class Envs:
    """``n`` CartPole-v1 envs stepped together (reset by hand: the final observation
    goes into the buffer, the reset one is acted on next)."""

    def __init__(self, n: int, seed: int) -> None:
        import gymnasium as gym

        self.envs = [gym.make("CartPole-v1") for _ in range(n)]
        self.obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(self.envs)]).astype(np.float32)
        self.returns = np.zeros(n)

    def step(self, actions: np.ndarray):
        out = [e.step(int(a)) for e, a in zip(self.envs, actions)]
        nxt = np.stack([o[0] for o in out]).astype(np.float32)
        reward = np.array([o[1] for o in out], np.float32)
        term = np.array([o[2] for o in out])
        trunc = np.array([o[3] for o in out])
        self.returns += reward
        step = {"obs": self.obs, "action": actions, "reward": reward, "next_obs": nxt}
        finished = []
        for i in np.flatnonzero(term | trunc):
            finished.append(float(self.returns[i]))
            self.returns[i] = 0
            nxt = nxt.copy()
            nxt[i] = self.envs[i].reset()[0]
        self.obs = nxt
        return step, term, trunc, finished


def act(model, obs: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
    import torch

    with torch.no_grad():
        greedy = model(torch.from_numpy(obs)).argmax(1).numpy()
    explore = rng.random(len(obs)) < eps
    return np.where(explore, rng.integers(0, 2, len(obs)), greedy).astype(np.int64)


def actor(name: str, weights_name: str, index: int, returns: "mp.Queue", stop: "mp.Event") -> None:
    import torch

    torch.set_num_threads(1)
    buf = shmbuf.EpisodeBuffer.attach(name)
    weights = shmbuf.Weights.attach(weights_name)
    model, version = q_network(), 0
    rng = np.random.default_rng(index)
    envs = Envs(ENVS_PER_ACTOR, seed=1000 * index)
    with buf.writer(envs=ENVS_PER_ACTOR) as w:
        t = 0
        while not stop.is_set():
            if t % 10 == 0:
                version = weights.load_into(model, newer_than=version) or version
            actions = act(model, envs.obs, epsilon(buf.core.total_added), rng)
            step, term, trunc, finished = envs.step(actions)
            while not stop.is_set():  # the rate limit holds actors to the learner's pace
                try:
                    w.add(step, terminated=term, truncated=trunc, timeout=0.5)
                    break
                except shmbuf.RateLimitTimeout:
                    pass
            for r in finished:
                returns.put((time.time(), r))
            t += 1
    weights.close()
    buf.close()


class DQN:
    """Double DQN with a hard-updated target network."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.q, self.target = q_network(), q_network()
        self.target.load_state_dict(self.q.state_dict())
        self.opt = torch.optim.Adam(self.q.parameters(), lr=LR)
        self.updates = 0

    def update(self, b: dict) -> None:
        torch = self.torch
        q = self.q(b["obs"]).gather(1, b["action"][:, None])[:, 0]
        with torch.no_grad():
            best = self.q(b["next_obs"]).argmax(1, keepdim=True)
            nxt = self.target(b["next_obs"]).gather(1, best)[:, 0]
            y = b["reward"] + GAMMA * (1.0 - b["terminated"]) * nxt
        loss = torch.nn.functional.smooth_l1_loss(q, y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.updates += 1
        if self.updates % TARGET_EVERY == 0:
            self.target.load_state_dict(self.q.state_dict())


def solved_at(curve: list[tuple[float, float]]) -> float | None:
    """The first time the mean of the last WINDOW returns reached SOLVED."""
    rets = [r for _, r in curve]
    for i in range(WINDOW, len(curve) + 1):
        if np.mean(rets[i - WINDOW:i]) >= SOLVED:
            return curve[i - 1][0]
    return None


def run_async(seconds: float, actors: int = 2) -> list[tuple[float, float]]:
    import torch

    from shmbuf.torch import TorchSampler

    torch.set_num_threads(1)
    tag = f"dqn-{os.getpid()}"
    lanes = actors * ENVS_PER_ACTOR
    ctx = mp.get_context("spawn")
    returns, stop = ctx.Queue(), ctx.Event()
    curve: list[tuple[float, float]] = []
    agent = DQN()
    # Reverb's SampleToInsertRatio: as many sampled rows per step written as the single
    # process trains on (BATCH per update, an update per step of its 8 envs), with some
    # slack; actors wait when they are ahead, so the CPU goes to the learner
    rate = shmbuf.RateLimit(min_size=LEARNING_STARTS, samples_per_insert=BATCH / 8, error_buffer=100 * BATCH)
    with shmbuf.EpisodeBuffer.create(FIELDS, 100_000, lanes=lanes, name=tag, rate=rate) as buf, \
            shmbuf.Weights.create(tag + "-w", agent.q.state_dict()) as weights:
        weights.publish(agent.q.state_dict())
        procs = [ctx.Process(target=actor, args=(buf.name, weights.name, i, returns, stop)) for i in range(actors)]
        t0 = time.time()
        for p in procs:
            p.start()
        try:
            while len(buf) < LEARNING_STARTS:
                time.sleep(0.05)
            with TorchSampler(buf, BATCH, dtype={"terminated": torch.float32}) as batches:
                for b in batches:
                    agent.update(b)
                    if agent.updates % PUBLISH_EVERY == 0:
                        weights.publish(agent.q.state_dict())
                    try:
                        while True:
                            t, r = returns.get_nowait()
                            curve.append((t - t0, r))
                    except queue.Empty:
                        pass
                    if time.time() - t0 > seconds or solved_at(curve[-WINDOW:]) is not None:
                        break
        finally:
            stop.set()
            for p in procs:
                p.join(30)
    return curve


def run_single(seconds: float, envs: int = 8) -> list[tuple[float, float]]:
    import torch

    torch.set_num_threads(1)
    agent, rng = DQN(), np.random.default_rng(0)
    env = Envs(envs, seed=0)
    curve: list[tuple[float, float]] = []
    t0 = time.time()
    with shmbuf.EpisodeBuffer.create(FIELDS, 100_000, lanes=envs) as buf, buf.writer(envs=envs) as w:
        while time.time() - t0 < seconds and solved_at(curve[-WINDOW:]) is None:
            actions = act(agent.q, env.obs, epsilon(buf.core.total_added), rng)
            step, term, trunc, finished = env.step(actions)
            w.add(step, terminated=term, truncated=trunc)
            curve += [(time.time() - t0, r) for r in finished]
            if len(buf) >= LEARNING_STARTS:
                b = buf.sample(BATCH)
                b["terminated"] = b["terminated"].astype(np.float32)
                agent.update({k: torch.from_numpy(v) for k, v in b.items()})
    return curve


def plot(curves: dict[str, list[tuple[float, float]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, curve in curves.items():
        t = np.array([c[0] for c in curve])
        r = np.array([c[1] for c in curve])
        mean = np.convolve(r, np.ones(WINDOW) / WINDOW, mode="valid") if len(r) >= WINDOW else r
        ax.plot(t[len(t) - len(mean):], mean, label=label)
    ax.axhline(SOLVED, color="grey", ls="--", lw=1)
    ax.set_xlabel("wall-clock seconds (2 cores)")
    ax.set_ylabel(f"return, mean of the last {WINDOW} episodes")
    ax.set_title("DQN on CartPole-v1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["async", "single", "both"], default="both")
    ap.add_argument("--seconds", type=float, default=240.0, help="time limit of each run")
    ap.add_argument("--plot", default="async_dqn.png", help="where the plot goes (both modes)")
    ap.add_argument("--json", default=None, help="also write the curves here")
    args = ap.parse_args()
    curves = {}
    if args.mode in ("async", "both"):
        curves["async: 2 actor processes + learner (shmbuf)"] = run_async(args.seconds)
    if args.mode in ("single", "both"):
        curves["single process: step, then update"] = run_single(args.seconds)
    for label, curve in curves.items():
        at = solved_at(curve)
        print(f"{label}: {len(curve)} episodes; mean of {WINDOW} returns reached {SOLVED:g} "
              + (f"after {at:.0f} s" if at is not None else f"not within {args.seconds:g} s"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(curves, f)
    if len(curves) == 2:
        plot(curves, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
