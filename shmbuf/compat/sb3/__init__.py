"""stable-baselines3's replay buffers, in shared memory: a one-line switch for SB3 and
CleanRL users.

``ReplayBuffer``, ``DictReplayBuffer``, ``HerReplayBuffer`` and ``NStepReplayBuffer`` take SB3 2.x's constructors and give SB3's
``add`` / ``extend`` / ``sample`` / ``size`` / ``reset``, so ``replay_buffer_class=`` of
DQN, SAC, TD3 and DDPG accepts them, and CleanRL's scripts run with their import
changed (``from shmbuf.compat.sb3 import ReplayBuffer``). They subclass SB3's classes
(SB3 checks ``isinstance`` when it loads a buffer). What changes is where the rows live:

* **In shared memory, by name.** Any process attaches with ``ReplayBuffer.attach(name)``
  and adds or samples at the same time as the others; each env of a handle writes a lane
  of its own (a buffer made with ``lanes=`` more than ``n_envs`` leaves room for other
  processes' envs), and no sample ever returns a row being written.
* **Pickling.** A buffer handed to a process that :mod:`multiprocessing` is starting
  (``Process(args=...)`` under spawn or forkserver) travels **by name**: the child
  attaches to the same rows. Everywhere else (``pickle.dump``, ``copy.deepcopy``, SB3's
  ``model.save_replay_buffer``) it pickles **by value**: its configuration and rows, which
  load into a new buffer of their own in any process, later, after the original is gone.
  (multiprocessing's own test, ``get_spawning_popen()``, tells the two apart.)
* **Fork.** A process forked with a buffer (Linux's default start method) gets a copy
  that claims lanes of its own at its first ``add``: parent and child both add.
* **``optimize_memory_usage=True``** stores each observation once (an
  :class:`shmbuf.EpisodeBuffer`), with the real final observation where an episode ended
  (SB3's own option loses it at time limits, which is why SB3 refuses it together with
  ``handle_timeout_termination``; here both work). As SB3's, each env's newest step is
  sampled at once, from any process: its next observation waits in a slot of its lane
  (:mod:`shmbuf.compat.sb3.newest`) until the next step's row holds it. An env reset
  between two ``add`` calls (a new ``learn()``) is seen: the step before is never joined
  to the new episode, and is left out once that episode's first step is written, where
  SB3 marks it done.

Divergences from SB3 (each kept on purpose): rows never written are never sampled, so
setting ``full = True`` by hand is refused (SB3 then samples its zero-filled arrays);
``pos`` and ``full`` are read from the shared ring (the first lane's); ``observations``
and the other arrays are read-only views of the shared rows (lane-major, so
``observations[pos, env]`` is SB3's indexing; with ``optimize_memory_usage`` they hold
episodes' final rows too).

Examples:
    >>> import numpy as np
    >>> from gymnasium import spaces
    >>> rb = ReplayBuffer(100, spaces.Box(-1, 1, (3,)), spaces.Discrete(2), device="cpu")
    >>> obs = np.zeros((1, 3), np.float32)
    >>> rb.add(obs, obs + 1, np.array([1]), np.array([0.5]), np.array([False]), [{}])
    >>> s = rb.sample(4)
    >>> tuple(s.rewards.shape), tuple(s.actions.shape), s.dones.dtype, rb.size()
    ((4, 1), (4, 1), torch.float32, 1)
    >>> rb.close()
"""

from shmbuf.compat import require

require(__name__, "sb3", ("torch", "gymnasium", "stable_baselines3"))

from shmbuf.compat.sb3.buffers import DictReplayBuffer, ReplayBuffer  # noqa: E402
from shmbuf.compat.sb3.her import HerReplayBuffer  # noqa: E402
from shmbuf.compat.sb3.nstep import NStepReplayBuffer  # noqa: E402

__all__ = ["DictReplayBuffer", "HerReplayBuffer", "NStepReplayBuffer", "ReplayBuffer"]
for _cls in (DictReplayBuffer, HerReplayBuffer, NStepReplayBuffer, ReplayBuffer):
    _cls.__module__ = __name__  # (where users import them from: reprs, pickles)
