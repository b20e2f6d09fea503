"""DQN on CartPole in the shape of CleanRL's ``dqn.py`` (one file, SB3's ReplayBuffer),
for gymnasium 1.x. Switching it to shmbuf is one line: the ReplayBuffer import below
becomes ``from shmbuf.compat.sb3 import ReplayBuffer`` (scripts/bench-clients times
both; nothing else changes).

    python examples/cleanrl_dqn.py --seed 1 --total-timesteps 60000

Prints one JSON line at the end: the loop's wall and CPU time, the time spent in the
buffer's calls, steps per second, the time and step at which the mean of the last 20
episodic returns first reached 475 (CartPole solved), that mean at the end, and the
learning curve (the mean episodic return of each 1,000 steps).
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
import torch.optim as optim
from stable_baselines3.common.buffers import ReplayBuffer


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--total-timesteps", type=int, default=500000)
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--num-envs", type=int, default=1)
    p.add_argument("--buffer-size", type=int, default=10000)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--tau", type=float, default=1.0)
    p.add_argument("--target-network-frequency", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--start-e", type=float, default=1)
    p.add_argument("--end-e", type=float, default=0.05)
    p.add_argument("--exploration-fraction", type=float, default=0.5)
    p.add_argument("--learning-starts", type=int, default=10000)
    p.add_argument("--train-frequency", type=int, default=10)
    return p.parse_args()


def make_env(env_id, seed):
    def thunk():
        env = gym.make(env_id)
        env.action_space.seed(seed)
        return env
    return thunk


class QNetwork(nn.Module):
    def __init__(self, env):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(np.array(env.single_observation_space.shape).prod(), 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, env.single_action_space.n))

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e, end_e, duration, t):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


if __name__ == "__main__":
    args = parse_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = True
    device = torch.device("cpu")

    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, args.seed + i) for i in range(args.num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    q_network = QNetwork(envs).to(device)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(envs).to(device)
    target_network.load_state_dict(q_network.state_dict())

    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device,
                      handle_timeout_termination=False)
    start_time, start_cpu, in_buffer = time.time(), time.process_time(), 0.0
    returns, solved_at, solved_step, episodes = [], None, None, []

    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps,
                                  global_step)
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            q_values = q_network(torch.Tensor(obs).to(device))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)

        if "episode" in infos:
            for r in infos["episode"]["r"][infos["_episode"]]:
                returns.append(float(r))
                episodes.append((global_step, float(r)))
                if solved_at is None and len(returns) >= 20 and np.mean(returns[-20:]) >= 475:
                    solved_at, solved_step = time.time() - start_time, global_step

        real_next_obs = next_obs.copy()
        for idx, ended in enumerate(terminations | truncations):
            if ended:
                real_next_obs[idx] = infos["final_obs"][idx]
        t = time.perf_counter()
        rb.add(obs, real_next_obs, actions, rewards, terminations, infos)
        in_buffer += time.perf_counter() - t
        obs = next_obs

        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                t = time.perf_counter()
                data = rb.sample(args.batch_size)
                in_buffer += time.perf_counter() - t
                with torch.no_grad():
                    target_max, _ = target_network(data.next_observations).max(dim=1)
                    td_target = data.rewards.flatten() + args.gamma * target_max * (1 - data.dones.flatten())
                old_val = q_network(data.observations).gather(1, data.actions).squeeze()
                loss = F.mse_loss(td_target, old_val)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if global_step % args.target_network_frequency == 0:
                for target_param, q_param in zip(target_network.parameters(), q_network.parameters()):
                    target_param.data.copy_(args.tau * q_param.data + (1.0 - args.tau) * target_param.data)

    wall, cpu = time.time() - start_time, time.process_time() - start_cpu
    curve = [round(float(np.mean([r for s, r in episodes if s // 1000 == k])), 1)
             if any(s // 1000 == k for s, _ in episodes) else None for k in range(args.total_timesteps // 1000)]
    print(json.dumps({"buffer": type(rb).__module__, "seed": args.seed, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                      "buffer_s": round(in_buffer, 3), "curve": curve,
                      "sps": round(args.total_timesteps / wall), "solved_s": solved_at and round(solved_at, 2),
                      "solved_step": solved_step, "last20": round(float(np.mean(returns[-20:])), 1) if returns else None}))
    envs.close()
