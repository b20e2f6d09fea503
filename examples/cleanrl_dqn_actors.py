"""examples/cleanrl_dqn.py made asynchronous with shmbuf.Actors: 2 actor processes of 4
CartPole envs each add to a shared SB3-style ReplayBuffer while the learner trains, at
CleanRL's ratio of sampled to added rows (a RateLimit). Stops when solved (the mean of
the last 20 returns >= 475) or after --seconds; prints one JSON line as cleanrl_dqn.py.
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
from shmbuf.compat.sb3 import ReplayBuffer

ACTORS, ENVS = 2, 4


class QNetwork(nn.Module):  # CleanRL's
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.network = nn.Sequential(nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                     nn.Linear(84, n_actions))

    def forward(self, x):
        return self.network(x)


def epsilon(args, step):  # CleanRL's linear schedule, over the steps of all actors
    duration = args["exploration_fraction"] * args["total_timesteps"]
    return max(args["start_e"] + (args["end_e"] - args["start_e"]) * step / duration, args["end_e"])


def act(actor, args):  # in each actor process: step the envs, add, report returns
    torch.set_num_threads(1)
    rng = random.Random(actor.seed)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(args["env_id"])] * ENVS,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    q = QNetwork(int(np.prod(envs.single_observation_space.shape)), envs.single_action_space.n)
    obs, _ = envs.reset(seed=actor.seed)
    rb = actor.buffer
    while not actor.stopped:
        actor.pull(q)
        if rng.random() < epsilon(args, rb.total_added):
            actions = envs.action_space.sample()
        else:
            with torch.no_grad():
                actions = q(torch.as_tensor(obs)).argmax(1).numpy()
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        real_next_obs = next_obs.copy()
        for idx in np.flatnonzero(terminations | truncations):
            real_next_obs[idx] = infos["final_obs"][idx]
        if not actor.retry(rb.add, obs, real_next_obs, actions, rewards, terminations | truncations,
                           [{"TimeLimit.truncated": t} for t in truncations]):
            break
        if "episode" in infos:
            actor.report(returns=infos["episode"]["r"][infos["_episode"]].tolist())
        obs = next_obs


def learn(args):
    torch.manual_seed(args["seed"])
    torch.set_num_threads(1)
    env = gym.make(args["env_id"])
    q, target = (QNetwork(int(np.prod(env.observation_space.shape)), env.action_space.n) for _ in range(2))
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=args["learning_rate"])
    rate = shmbuf.RateLimit(min_size=args["learning_starts"], error_buffer=100 * args["batch_size"],
                            samples_per_insert=args["batch_size"] / args["train_frequency"])
    rb = ReplayBuffer(args["buffer_size"], env.observation_space, env.action_space, "cpu", n_envs=ENVS,
                      lanes=ACTORS * ENVS, rate=rate, seed=args["seed"])
    weights = shmbuf.Weights.create(f"{rb.name}-q", q.state_dict())
    returns, solved_at, updates, start = [], None, 0, time.time()
    with shmbuf.Actors(act, rb, ACTORS, weights=weights, seed=args["seed"], args=(args,)) as actors:
        while solved_at is None and time.time() - start < args["seconds"]:
            for r in actors.reports():
                returns += r["returns"]
            if len(returns) >= 20 and np.mean(returns[-20:]) >= 475:
                solved_at = time.time() - start
            try:
                data = rb.sample(args["batch_size"], timeout=0.1)
            except shmbuf.RateLimitTimeout:  # the actors have not added enough rows yet
                continue
            with torch.no_grad():
                target_max, _ = target(data.next_observations).max(dim=1)
                td_target = data.rewards.flatten() + args["gamma"] * target_max * (1 - data.dones.flatten())
            old_val = q(data.observations).gather(1, data.actions).squeeze()
            loss = F.mse_loss(td_target, old_val)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1
            weights.publish(q.state_dict())
            if updates % (args["target_network_frequency"] // args["train_frequency"]) == 0:
                target.load_state_dict(q.state_dict())
        steps = rb.total_added
    weights.close()
    rb.close()
    wall = time.time() - start
    return {"buffer": "shmbuf.compat.sb3 + shmbuf.Actors", "seed": args["seed"], "wall_s": round(wall, 2),
            "sps": round(steps / wall), "solved_s": solved_at and round(solved_at, 2),
            "last20": round(float(np.mean(returns[-20:])), 1) if returns else None}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for flag, default in [("seed", 1), ("env_id", "CartPole-v1"), ("total_timesteps", 60000), ("seconds", 120.0),
                          ("learning_rate", 2.5e-4), ("buffer_size", 10000), ("gamma", 0.99),
                          ("target_network_frequency", 500), ("batch_size", 128), ("start_e", 1.0),
                          ("end_e", 0.05), ("exploration_fraction", 0.5), ("learning_starts", 10000),
                          ("train_frequency", 10)]:
        p.add_argument("--" + flag.replace("_", "-"), type=type(default), default=default)
    print(json.dumps(learn(vars(p.parse_args()))))
