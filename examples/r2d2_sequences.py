"""An R2D2-shaped recurrent learner: prioritized sequences with burn-in, on CartPole
with the velocities hidden (so the agent needs memory).

An actor process steps envs with an LSTM Q-network (epsilon-greedy) and writes every
step into a prioritized ``shmbuf.EpisodeBuffer``, together with the LSTM state it had
*before* the step (``h``, ``c``: stored as ordinary fields). The learner draws
sequences by priority with ``sample_trajectories(B, L, burn_in=K, beta=...)``: it
starts the LSTM from the stored state at the first burn-in step, runs the burn-in
steps without gradient to warm it, then trains on the ``L`` steps with n-step double-Q
targets, and sets one priority per sequence (``0.9 * max|td| + 0.1 * mean|td|``).

    pip install torch==2.13.0
    pip install gymnasium -e .
    python examples/r2d2_sequences.py --seconds 120
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np

import shmbuf

HID, L, BURN, BATCH, ENVS = 32, 10, 10, 32, 4
GAMMA, LR = 0.99, 1e-3
FIELDS = {"obs": ((2,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
          "h": ((HID,), np.float32), "c": ((HID,), np.float32)}


def network():
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(2, HID, batch_first=True)
            self.q = torch.nn.Linear(HID, 2)

        def forward(self, obs, state):
            out, state = self.lstm(obs, state)
            return self.q(out), state
    return Net()


def actor(name: str, weights_name: str, seed: int, stop) -> None:
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)
    buf = shmbuf.EpisodeBuffer.attach(name)
    weights = shmbuf.Weights.attach(weights_name)
    net, version, rng = network(), 0, np.random.default_rng(seed)
    envs = [gym.make("CartPole-v1") for _ in range(ENVS)]
    obs = np.stack([e.reset(seed=seed * 100 + i)[0][[0, 2]] for i, e in enumerate(envs)]).astype(np.float32)
    h, c = np.zeros((ENVS, HID), np.float32), np.zeros((ENVS, HID), np.float32)
    with buf.writer(envs=ENVS) as w:
        while not stop.is_set():
            version = weights.load_into(net, newer_than=version) or version
            with torch.no_grad():
                q, (h2, c2) = net(torch.from_numpy(obs)[:, None], (torch.from_numpy(h)[None], torch.from_numpy(c)[None]))
            act = q[:, 0].argmax(1).numpy()
            act = np.where(rng.random(ENVS) < 0.1, rng.integers(0, 2, ENVS), act)
            out = [e.step(int(a)) for e, a in zip(envs, act)]
            nxt = np.stack([o[0][[0, 2]] for o in out]).astype(np.float32)
            term, trunc = np.array([o[2] for o in out]), np.array([o[3] for o in out])
            w.add({"obs": obs, "action": act, "reward": np.array([o[1] for o in out], np.float32),
                   "h": h, "c": c, "next_obs": nxt}, terminated=term, truncated=trunc)
            h, c = h2[0].numpy(), c2[0].numpy()
            for i in np.flatnonzero(term | trunc):
                nxt[i] = envs[i].reset()[0][[0, 2]]
                h[i], c[i] = 0, 0
            obs = nxt


def learn_step(net, target, opt, buf) -> tuple[float, dict]:
    import torch

    t = buf.sample_trajectories(BATCH, L + 1, burn_in=BURN, beta=0.6)
    obs = torch.from_numpy(t["obs"])
    first = t["mask"].argmax(1)  # the first position that holds a step: its stored state starts the LSTM
    rows = np.arange(BATCH)
    state = (torch.from_numpy(t["h"][rows, first])[None], torch.from_numpy(t["c"][rows, first])[None])
    with torch.no_grad():  # burn-in: warm the stored state on the steps before the window
        _, state = net(obs[:, :BURN], state)
        _, tstate = target(obs[:, :BURN], state)
    q, _ = net(obs[:, BURN:], state)
    with torch.no_grad():
        qt, _ = target(obs[:, BURN:], tstate)
        best = q.argmax(-1, keepdim=True)
    act = torch.from_numpy(t["action"][:, BURN:])
    rew = torch.from_numpy(t["reward"][:, BURN:]).float()
    mask = torch.from_numpy(t["mask"][:, BURN:]).float()
    done = torch.from_numpy(t["terminated"][:, BURN:]).float()
    q_a = q.gather(-1, act[..., None]).squeeze(-1)[:, :-1]
    boot = qt.gather(-1, best).squeeze(-1)[:, 1:]
    y = rew[:, :-1] + GAMMA * (1 - done[:, :-1]) * boot * mask[:, 1:]
    valid = mask[:, :-1]
    td = (q_a - y) * valid
    w = torch.from_numpy(t["weight"]).float()[:, None]
    loss = (w * td ** 2).sum() / valid.sum().clamp(min=1)
    opt.zero_grad()
    loss.backward()
    opt.step()
    a = td.abs().detach().numpy()
    prio = 0.9 * a.max(1) + 0.1 * a.sum(1) / np.maximum(valid.numpy().sum(1), 1) + 1e-3
    buf.update_priorities(t["index"], prio)
    return float(loss.detach()), t


def train(seconds: float, min_updates: int = 0, seed: int = 0) -> dict:
    import torch

    torch.manual_seed(seed)
    net, target = network(), network()
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    updates, losses = 0, []
    with shmbuf.EpisodeBuffer.create(FIELDS, 20_000 * ENVS, lanes=ENVS, priority=0.9, seed=seed) as buf, \
            shmbuf.Weights.create(f"{buf.name}-w", net.state_dict()) as weights:
        weights.publish(net.state_dict())
        p = ctx.Process(target=actor, args=(buf.name, weights.name, seed, stop))
        p.start()
        try:
            while buf.transition_count < BATCH * (L + BURN):
                time.sleep(0.05)
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds or updates < min_updates:
                loss, _ = learn_step(net, target, opt, buf)
                losses.append(loss)
                updates += 1
                if updates % 50 == 0:
                    weights.publish(net.state_dict())
                if updates % 200 == 0:
                    target.load_state_dict(net.state_dict())
        finally:
            stop.set()
            p.join(60)
        episodes = buf.num_episodes
    return {"updates": updates, "losses": losses, "episodes": episodes}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    got = train(args.seconds)
    print(f"{got['updates']} updates over {got['episodes']} episodes, last loss {got['losses'][-1]:.4f}")
