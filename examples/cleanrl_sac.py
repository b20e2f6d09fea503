"""SAC on Pendulum in the shape of CleanRL's ``sac_continuous_action.py`` (one file, SB3's
ReplayBuffer, CleanRL's networks and hyperparameters but the number of steps), for
gymnasium 1.x. Switching it to shmbuf is one line: the ReplayBuffer import below becomes
``from shmbuf.compat.sb3 import ReplayBuffer`` (scripts/bench-clients times both;
nothing else changes).

    python examples/cleanrl_sac.py --seed 1 --total-timesteps 12000

Prints one JSON line at the end: the loop's wall and CPU time, the time spent in the
buffer's calls, steps per second and the learning curve (the mean episodic return of
each 1,000 steps).
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

LOG_STD_MAX, LOG_STD_MIN = 2, -5


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--env-id", default="Pendulum-v1")
    p.add_argument("--total-timesteps", type=int, default=12000)
    p.add_argument("--num-envs", type=int, default=1)
    p.add_argument("--buffer-size", type=int, default=1000000)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--tau", type=float, default=0.005)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--policy-lr", type=float, default=3e-4)
    p.add_argument("--q-lr", type=float, default=1e-3)
    p.add_argument("--policy-frequency", type=int, default=2)
    p.add_argument("--target-network-frequency", type=int, default=1)
    p.add_argument("--alpha", type=float, default=0.2)
    p.add_argument("--autotune", type=int, default=1)
    return p.parse_args()


def make_env(env_id, seed):
    def thunk():
        env = gym.make(env_id)
        env.action_space.seed(seed)
        return env
    return thunk


class SoftQNetwork(nn.Module):
    def __init__(self, env):
        super().__init__()
        n_in = np.prod(env.single_observation_space.shape) + np.prod(env.single_action_space.shape)
        self.fc1, self.fc2, self.fc3 = nn.Linear(n_in, 256), nn.Linear(256, 256), nn.Linear(256, 1)

    def forward(self, x, a):
        x = F.relu(self.fc1(torch.cat([x, a], 1)))
        return self.fc3(F.relu(self.fc2(x)))


class Actor(nn.Module):
    def __init__(self, env):
        super().__init__()
        n_act = np.prod(env.single_action_space.shape)
        self.fc1 = nn.Linear(np.prod(env.single_observation_space.shape), 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mean, self.fc_logstd = nn.Linear(256, n_act), nn.Linear(256, n_act)
        high, low = env.single_action_space.high, env.single_action_space.low
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, x):
        x = F.relu(self.fc2(F.relu(self.fc1(x))))
        log_std = torch.tanh(self.fc_logstd(x))
        return self.fc_mean(x), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def get_action(self, x):
        mean, log_std = self(x)
        normal = torch.distributions.Normal(mean, log_std.exp())
        x_t = normal.rsample()
        y_t = torch.tanh(x_t)
        action = y_t * self.action_scale + self.action_bias
        log_prob = normal.log_prob(x_t) - torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)
        return action, log_prob.sum(1, keepdim=True), torch.tanh(mean) * self.action_scale + self.action_bias


if __name__ == "__main__":
    args = parse_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, args.seed + i) for i in range(args.num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    actor = Actor(envs).to(device)
    qf1, qf2, qf1_target, qf2_target = (SoftQNetwork(envs).to(device) for _ in range(4))
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.q_lr)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args.policy_lr)
    if args.autotune:
        target_entropy = -torch.prod(torch.Tensor(envs.single_action_space.shape).to(device)).item()
        log_alpha = torch.zeros(1, requires_grad=True, device=device)
        alpha = log_alpha.exp().item()
        a_optimizer = optim.Adam([log_alpha], lr=args.q_lr)
    else:
        alpha = args.alpha

    envs.single_observation_space.dtype = np.float32
    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device,
                      n_envs=args.num_envs, handle_timeout_termination=False)
    start_time, start_cpu, in_buffer = time.time(), time.process_time(), 0.0
    episodes = []  # (step, return)

    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        if global_step < args.learning_starts:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            actions, _, _ = actor.get_action(torch.Tensor(obs).to(device))
            actions = actions.detach().cpu().numpy()

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        if "episode" in infos:
            episodes += [(global_step, float(r)) for r in infos["episode"]["r"][infos["_episode"]]]

        real_next_obs = next_obs.copy()
        for idx, ended in enumerate(terminations | truncations):
            if ended:
                real_next_obs[idx] = infos["final_obs"][idx]
        t = time.perf_counter()
        rb.add(obs, real_next_obs, actions, rewards, terminations, infos)
        in_buffer += time.perf_counter() - t
        obs = next_obs

        if global_step > args.learning_starts:
            t = time.perf_counter()
            data = rb.sample(args.batch_size)
            in_buffer += time.perf_counter() - t
            with torch.no_grad():
                next_actions, next_log_pi, _ = actor.get_action(data.next_observations)
                min_next = torch.min(qf1_target(data.next_observations, next_actions),
                                     qf2_target(data.next_observations, next_actions)) - alpha * next_log_pi
                next_q = data.rewards.flatten() + (1 - data.dones.flatten()) * args.gamma * min_next.view(-1)
            qf1_a = qf1(data.observations, data.actions).view(-1)
            qf2_a = qf2(data.observations, data.actions).view(-1)
            qf_loss = F.mse_loss(qf1_a, next_q) + F.mse_loss(qf2_a, next_q)
            q_optimizer.zero_grad()
            qf_loss.backward()
            q_optimizer.step()

            if global_step % args.policy_frequency == 0:
                for _ in range(args.policy_frequency):
                    pi, log_pi, _ = actor.get_action(data.observations)
                    min_qf_pi = torch.min(qf1(data.observations, pi), qf2(data.observations, pi))
                    actor_loss = ((alpha * log_pi) - min_qf_pi).mean()
                    actor_optimizer.zero_grad()
                    actor_loss.backward()
                    actor_optimizer.step()
                    if args.autotune:
                        with torch.no_grad():
                            _, log_pi, _ = actor.get_action(data.observations)
                        alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()
                        a_optimizer.zero_grad()
                        alpha_loss.backward()
                        a_optimizer.step()
                        alpha = log_alpha.exp().item()

            if global_step % args.target_network_frequency == 0:
                for param, target_param in zip(qf1.parameters(), qf1_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                for param, target_param in zip(qf2.parameters(), qf2_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)

    wall, cpu = time.time() - start_time, time.process_time() - start_cpu
    curve = [round(float(np.mean([r for s, r in episodes if s // 1000 == k])), 1)
             if any(s // 1000 == k for s, _ in episodes) else None for k in range(args.total_timesteps // 1000)]
    print(json.dumps({"buffer": type(rb).__module__, "seed": args.seed, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                      "buffer_s": round(in_buffer, 3), "sps": round(args.total_timesteps / wall), "curve": curve,
                      "last": curve[-1] if curve else None}))
    envs.close()
