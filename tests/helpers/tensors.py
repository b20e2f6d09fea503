"""torch actors.

Code that runs in child processes lives here, importable by name (spawn, forkserver
and Ray workers import it).
"""

from __future__ import annotations

import shmbuf

def torch_actor(name: str, results) -> None:
    import torch

    torch.manual_seed(123)  # other initial weights than the learner's
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    w = shmbuf.Weights.attach(name)
    version = w.load_into(model)
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    results.put((version, model(x).detach().numpy().tolist(), w.load_into(model, newer_than=version)))
    w.close()

__all__ = ['torch_actor']
