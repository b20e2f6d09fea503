"""Asynchronous DQN whose learner samples only recent-policy data (policy versions).

CleanRL's DQN (examples/cleanrl_dqn.py) on shmbuf.Actors: 2 actor processes of 4
CartPole envs each write transitions into a plain ``shmbuf.Buffer`` created with
``versions=True``. ``shmbuf.Actors`` binds each actor's handle, so every row carries the
version of the weights its actor acted with, with no extra call. The learner publishes
its weights after every update and samples with ``max_staleness=--max-staleness``: only
rows made by its last k + 1 versions of the Q-network, drawn uniformly (a binary search
per lane, never a scan). A RateLimit holds the actors to CleanRL's ratio of sampled to
added rows. Prints one JSON line: time to solve (the mean of the last 20 returns >= 475),
and the staleness of what the learner sampled.

    pip install torch==2.13.0
    pip install gymnasium -e .
    python examples/dqn_recent.py --seed 1 --max-staleness 500
"""

import argparse
import json
import random
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import shmbuf

ACTORS, ENVS = 2, 4
FIELDS = {"obs": ((4,), np.float32), "next_obs": ((4,), np.float32), "action": ((), np.int64),
          "reward": ((), np.float32), "done": ((), np.float32)}


class QNetwork(nn.Module):  # CleanRL's (as examples/cleanrl_dqn_actors.py, which needs SB3)
    def __init__(self):
        super().__init__()
        self.network = nn.Sequential(nn.Linear(4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 2))

    def forward(self, x):
        return self.network(x)


def epsilon(args, step):  # CleanRL's linear schedule, over the steps of all actors
    duration = args["exploration_fraction"] * args["total_timesteps"]
    return max(args["start_e"] + (args["end_e"] - args["start_e"]) * step / duration, args["end_e"])


def act(actor, args):  # in each actor process: step the envs, add (versioned by the bound actor)
    torch.set_num_threads(1)
    rng = random.Random(actor.seed)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * ENVS,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    q = QNetwork()
    obs, _ = envs.reset(seed=actor.seed)
    rb = actor.buffer
    while not actor.stopped:
        actor.pull(q)  # (rows written from here carry the version pulled)
        if rng.random() < epsilon(args, rb.total_added):
            actions = envs.action_space.sample()
        else:
            with torch.no_grad():
                actions = q(torch.as_tensor(obs)).argmax(1).numpy()
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        real_next_obs = next_obs.copy()
        for idx in np.flatnonzero(terminations | truncations):
            real_next_obs[idx] = infos["final_obs"][idx]
        rows = {"obs": obs, "next_obs": real_next_obs, "action": actions, "reward": rewards,
                "done": terminations.astype(np.float32)}
        if not actor.retry(rb.extend, rows):
            break
        if "episode" in infos:
            actor.report(returns=infos["episode"]["r"][infos["_episode"]].tolist())
        obs = next_obs


def learn(args):
    torch.manual_seed(args["seed"])
    torch.set_num_threads(1)
    q, target = QNetwork(), QNetwork()
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=args["learning_rate"])
    rate = shmbuf.RateLimit(min_size=args["learning_starts"], error_buffer=100 * args["batch_size"],
                            samples_per_insert=args["batch_size"] / args["train_frequency"])
    rb = shmbuf.Buffer.create(FIELDS, args["buffer_size"], lanes=ACTORS, rate=rate, seed=args["seed"], versions=True)
    weights = shmbuf.Weights.create(f"{rb.name}-q", q.state_dict())
    weights.publish(q.state_dict())
    rb.bind(weights)  # max_staleness counts from the weights the learner published last
    returns, solved_at, updates, start = [], None, 0, time.time()
    with shmbuf.Actors(act, rb, ACTORS, weights=weights, seed=args["seed"], args=(args,)) as actors:
        while (solved_at is None and time.time() - start < args["seconds"]) or updates < args.get("min_updates", 0):
            for r in actors.reports():
                returns += r["returns"]
            if len(returns) >= 20 and np.mean(returns[-20:]) >= 475:
                solved_at = time.time() - start
            try:  # rows of the learner's last max_staleness + 1 versions only
                data = rb.sample(args["batch_size"], timeout=0.1, max_staleness=args["max_staleness"])
            except (shmbuf.RateLimitTimeout, shmbuf.SampleTimeout):  # not enough (recent) rows yet
                continue
            b = {k: torch.from_numpy(v) for k, v in data.items()}
            with torch.no_grad():
                td_target = b["reward"] + args["gamma"] * target(b["next_obs"]).max(dim=1).values * (1 - b["done"])
            old_val = q(b["obs"]).gather(1, b["action"][:, None]).squeeze(1)
            loss = F.mse_loss(td_target, old_val)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1
            weights.publish(q.state_dict())
            if updates % (args["target_network_frequency"] // args["train_frequency"]) == 0:
                target.load_state_dict(q.state_dict())
        steps, stats = rb.total_added, rb.stats()
    weights.close()
    rb.close()
    wall = time.time() - start
    st = stats["sampled_staleness"] or {"mean": None, "max": None}
    return {"seed": args["seed"], "max_staleness": args["max_staleness"], "wall_s": round(wall, 2),
            "sps": round(steps / wall), "updates": updates, "solved_s": solved_at and round(solved_at, 2),
            "last20": round(float(np.mean(returns[-20:])), 1) if returns else None,
            "staleness_mean": st["mean"] and round(st["mean"], 1), "staleness_max": st["max"]}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for flag, default in [("seed", 1), ("total_timesteps", 60000), ("seconds", 120.0), ("learning_rate", 2.5e-4),
                          ("buffer_size", 10000), ("gamma", 0.99), ("target_network_frequency", 500),
                          ("batch_size", 128), ("start_e", 1.0), ("end_e", 0.05), ("exploration_fraction", 0.5),
                          ("learning_starts", 10000), ("train_frequency", 10), ("max_staleness", 500)]:
        p.add_argument("--" + flag.replace("_", "-"), type=type(default), default=default)
    print(json.dumps(learn(vars(p.parse_args()))))
