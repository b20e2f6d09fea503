"""PPO with asynchronous actors on CartPole, through a shmbuf queue.

Actor processes step CartPole-v1 envs with the newest policy they pulled from
``shmbuf.Weights`` and push fixed-length unrolls (``T`` steps of obs, action, log-prob,
reward, done, value, and the value of the observation after the last step) into a
``shmbuf.Buffer`` in queue mode: one lane per actor, no pickling, and an actor that
runs ahead of the learner waits (the queue is small) instead of overwriting. The
learner ``take``s batches of unrolls, each delivered exactly once, computes GAE on them
and runs clipped-PPO epochs. Every unroll carries the version of the weights its actor
acted with (``versions=True``), and the learner's takes have a lag limit (Sample
Factory's ``max_policy_lag``): ``take(..., max_staleness=LAG)`` passes over unrolls more
than ``LAG`` versions behind the weights it trains, counts them, and never delivers
them. An actor that dies gives nothing torn to the learner, and rows it had not
finished are never seen.

    pip install torch==2.13.0
    pip install gymnasium -e .
    python examples/ppo_queue.py                  # until solved (mean return >= 475)
    python examples/ppo_queue.py --seconds 20     # a short run
    python examples/ppo_queue.py --max-lag 0      # on-policy only: stale unrolls passed over
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np

import shmbuf

T, ENVS_PER_ACTOR, BATCH = 32, 4, 8  # steps per unroll, envs per actor, unrolls per update
GAMMA, LAMBDA, CLIP, LR, EPOCHS = 0.99, 0.95, 0.2, 2.5e-3, 4
FIELDS = {"obs": ((T, 4), np.float32), "action": ((T,), np.int64), "logp": ((T,), np.float32),
          "reward": ((T,), np.float32), "done": ((T,), np.float32), "value": ((T,), np.float32),
          "last_value": ((), np.float32), "episode_return": ((), np.float32)}


def network():
    import torch

    body = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh())
    return torch.nn.ModuleDict({"body": body, "pi": torch.nn.Linear(64, 2), "v": torch.nn.Linear(64, 1)})


def forward(net, obs):
    h = net["body"](obs)
    return net["pi"](h), net["v"](h).squeeze(-1)


def actor(queue_name: str, weights_name: str, seed: int, stop) -> None:
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)
    q = shmbuf.Buffer.attach(queue_name)
    weights = shmbuf.Weights.attach(weights_name)
    net, version = network(), 0
    envs = [gym.make("CartPole-v1") for _ in range(ENVS_PER_ACTOR)]
    obs = np.stack([e.reset(seed=seed * 100 + i)[0] for i, e in enumerate(envs)]).astype(np.float32)
    ret, finished = np.zeros(ENVS_PER_ACTOR), [[] for _ in envs]
    while not stop.is_set():
        version = weights.load_into(net, newer_than=version) or version
        u = {k: np.zeros((ENVS_PER_ACTOR,) + s, d) for k, (s, d) in FIELDS.items()}
        u["episode_return"][:] = np.nan
        for t in range(T):
            with torch.no_grad():
                logits, value = forward(net, torch.from_numpy(obs))
            dist = torch.distributions.Categorical(logits=logits)
            action = dist.sample()
            u["obs"][:, t], u["action"][:, t] = obs, action.numpy()
            u["logp"][:, t], u["value"][:, t] = dist.log_prob(action).numpy(), value.numpy()
            for i, e in enumerate(envs):
                o, r, term, trunc, _ = e.step(int(action[i]))
                ret[i] += r
                u["reward"][i, t], u["done"][i, t] = r, float(term)
                if term or trunc:
                    finished[i].append(ret[i])
                    ret[i] = 0
                    o = e.reset()[0]
                    u["done"][i, t] = 1.0  # (a truncation is cut like an end: the bootstrap is lost)
                obs[i] = o
        with torch.no_grad():
            u["last_value"][:] = forward(net, torch.from_numpy(obs))[1].numpy()
        for i in range(ENVS_PER_ACTOR):
            if finished[i]:
                u["episode_return"][i] = finished[i][-1]
                finished[i] = []
        try:
            q.extend(u, timeout=30, version=version)  # waits while the learner is behind
        except shmbuf.WriteTimeout:
            if not stop.is_set():
                raise


def gae(batch):
    rew, done, value = batch["reward"], batch["done"], batch["value"]
    adv = np.zeros_like(rew)
    last = np.zeros(len(rew), np.float32)
    nxt = batch["last_value"]
    for t in reversed(range(T)):
        delta = rew[:, t] + GAMMA * nxt * (1 - done[:, t]) - value[:, t]
        last = delta + GAMMA * LAMBDA * (1 - done[:, t]) * last
        adv[:, t], nxt = last, value[:, t]
    return adv, adv + value


def train(seconds: float, actors: int = 2, target: float = 475.0, seed: int = 0, max_lag: int | None = 2) -> dict:
    """Run PPO until the mean of the last 20 episode returns reaches ``target`` or
    ``seconds`` pass, taking unrolls at most ``max_lag`` versions behind (None: every
    unroll); returns the
    updates made, the returns seen, the time solved and the queue's counts."""
    import torch

    torch.manual_seed(seed)
    net = network()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    returns, updates, solved, lags = [], 0, None, []
    with shmbuf.Buffer.create(FIELDS, actors * 16, lanes=actors, mode="queue", versions=True) as q, \
            shmbuf.Weights.create(f"{q.name}-w", net.state_dict()) as weights:
        weights.publish(net.state_dict())
        procs = [ctx.Process(target=actor, args=(q.name, weights.name, seed * 10 + i, stop)) for i in range(actors)]
        for p in procs:
            p.start()
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < seconds and solved is None:
                # the oldest unrolls of the last max_lag + 1 versions, each delivered once
                b = q.take(BATCH, timeout=120) if max_lag is None else \
                    q.take(BATCH, timeout=120, max_staleness=max_lag, version=weights.version)
                returns += [float(r) for r in b["episode_return"] if not np.isnan(r)]
                lags.append(weights.version - b["version"])  # versions behind the weights trained
                adv, ret = gae(b)
                obs = torch.from_numpy(b["obs"].reshape(-1, 4))
                act = torch.from_numpy(b["action"].reshape(-1))
                old = torch.from_numpy(b["logp"].reshape(-1))
                adv_t = torch.from_numpy(adv.reshape(-1))
                adv_t = (adv_t - adv_t.mean()) / (adv_t.std() + 1e-8)
                ret_t = torch.from_numpy(ret.reshape(-1))
                for _ in range(EPOCHS):
                    logits, value = forward(net, obs)
                    dist = torch.distributions.Categorical(logits=logits)
                    ratio = torch.exp(dist.log_prob(act) - old)
                    pg = -torch.min(ratio * adv_t, torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * adv_t).mean()
                    loss = pg + 0.5 * ((value - ret_t) ** 2).mean() - 0.01 * dist.entropy().mean()
                    opt.zero_grad()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
                    opt.step()
                weights.publish(net.state_dict())
                updates += 1
                if len(returns) >= 20 and np.mean(returns[-20:]) >= target:
                    solved = time.monotonic() - t0
        finally:
            stop.set()
            for p in procs:
                p.join(60)
        stats = q.stats()
    return {"updates": updates, "returns": returns, "solved_s": solved, "rows_taken": stats["rows_taken"],
            "rows_stale": stats["rows_stale"], "lag": np.concatenate(lags) if lags else np.zeros(0, np.int64)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--max-lag", type=int, default=2, help="-1: no lag limit")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    got = train(args.seconds, args.actors, seed=args.seed, max_lag=None if args.max_lag < 0 else args.max_lag)
    last = np.mean(got["returns"][-20:]) if got["returns"] else float("nan")
    lag = got["lag"]
    print(f"{got['updates']} updates, {got['rows_taken']} unrolls taken ({got['rows_stale']} passed over as "
          f"stale; lag mean {lag.mean():.2f}, max {lag.max()}), mean of the last 20 returns {last:.0f}, "
          + (f"solved in {got['solved_s']:.0f} s" if got["solved_s"] else "not solved"))
