"""velora's ``ReplayBuffer`` and ``BatchExperience``, in shared memory.

Switch with one import::

    from shmbuf.compat.velora import ReplayBuffer, BatchExperience

``ReplayBuffer(capacity, state_dim, action_dim, hidden_dim, *, device=None)``: ``add`` one
transition, ``add_multi`` a batch (1-D actions, rewards and dones become ``(B, 1)``; more
rows than the capacity keep the last ``capacity``), ``len()``, ``sample(batch_size)`` a
:class:`BatchExperience` of float32 torch tensors on ``device`` (rewards and dones
``(B, 1)``; ``ValueError`` when fewer transitions are stored than asked for), ``metadata()``,
``state_dict()`` (the full-capacity tensors, in slot order), ``save(dirpath, prefix)``
(``<prefix>metadata.json`` and ``<prefix>state.safetensors``) and ``load(state_path,
metadata)``, ``config()`` and ``warm(agent, n_samples, num_envs)``. Everything is stored as
float32, as velora stores it. torch is needed (as by velora); safetensors is not: the
file is written and read here (its format is 8 bytes of header length, a JSON header,
raw little-endian data), and files of the real ``safetensors`` package load alike.
The storage velora's users read is there too: ``states``, ``actions``, ``rewards``,
``next_states``, ``dones``, ``hiddens`` (full-capacity tensors in slot order, zero-copy
views of the shared memory, so they show what every process writes, as it is written:
a row being written may show half of it; ``sample`` never does), ``position`` and ``size``.
Behaviour of velora at 88b8103 (Achronus/velora).
Divergences (docs/migrate/velora.md): sampling uses the buffer's own seeded generator (``seed=``), not
torch's global one; ``warm`` stops at the capacity instead of looping forever when
``n_samples`` is larger.

Examples:
    >>> import torch
    >>> buf = ReplayBuffer(100, state_dim=4, action_dim=1, hidden_dim=2)
    >>> for i in range(3):
    ...     buf.add(torch.full((4,), float(i)), torch.tensor([1.0]), 0.5, torch.zeros(4), False, torch.zeros(2))
    >>> b = buf.sample(2)
    >>> len(buf), tuple(b.states.shape), tuple(b.rewards.shape), b.dones.dtype
    (3, (2, 4), (2, 1), torch.float32)
    >>> buf.close()
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from pathlib import Path
from typing import Any, Optional

import numpy as np

from shmbuf.buffer import handle as core
from shmbuf.compat.shared import Shared
from shmbuf.core.layout import published

KIND = "velora.ReplayBuffer"
FIELDS = ("states", "actions", "rewards", "next_states", "dones", "hiddens")


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("the velora facade needs PyTorch, as velora does: pip install torch") from None
    return torch


@dataclasses.dataclass
class BatchExperience:
    """A batch of transitions as torch tensors, batch axis first (velora's)."""

    states: Any
    actions: Any
    rewards: Any
    next_states: Any
    dones: Any
    hiddens: Any


def _rows(value: Any, n: Optional[int], width: int, what: str) -> np.ndarray:
    """``value`` (tensor, array, number) as float32 ``(width,)`` (``n`` None: one row) or
    ``(n, width)``: any shape of that many values, so ``(1, 4)`` states and ``(B,)``
    rewards fit as velora's do."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    a = np.asarray(value, dtype=np.float32)
    want = (width,) if n is None else (n, width)
    if a.size != int(np.prod(want)):
        raise ValueError(f"{what}: expected {int(np.prod(want))} values {want}, got shape {a.shape}")
    return a.reshape(want)


class ReplayBuffer(Shared):
    """Off-policy experience (velora's ``ReplayBuffer``), in shared memory."""

    def __init__(self, capacity: int, state_dim: int, action_dim: int, hidden_dim: int, *,
                 device: Any = None, name: Optional[str] = None, seed: Any = None,
                 persist: bool = False) -> None:
        dims = {"states": state_dim, "actions": action_dim, "rewards": 1, "next_states": state_dim,
                "dones": 1, "hiddens": hidden_dim}
        described = {"kind": KIND, "device": None if device is None else str(device)}
        self._open(core.Buffer.create({k: ((int(d),), np.float32) for k, d in dims.items()}, capacity,
                                      name=name, seed=seed, persist=persist, _library=described), device)

    def _open(self, handle: core.Buffer, device: Any) -> None:
        self._core = handle
        self.capacity = handle.capacity
        f = handle.fields
        self.state_dim, self.action_dim, self.hidden_dim = (f[k][0][0] for k in ("states", "actions", "hiddens"))
        self.device = _torch().device("cpu" if device is None else device)
        self._device_given = device

    @classmethod
    def attach(cls, name: str, *, device: Any = None, seed: Any = None) -> "ReplayBuffer":
        """This buffer from another process, by name."""
        handle = core.Buffer.attach(name, seed=seed)
        described = handle.engine.layout.meta
        if described.get("kind") != KIND:
            handle.close()
            raise ValueError(f"buffer {name!r} is not a velora ReplayBuffer")
        self = object.__new__(cls)
        self._open(handle, device if device is not None else described.get("device"))
        return self

    # -- writing -------------------------------------------------------------------------

    def add(self, state: Any, action: Any, reward: float, next_state: Any, done: bool, hidden: Any) -> None:
        """Add one transition (stored as float32; ``done`` as 1.0 or 0.0)."""
        row = {"states": _rows(state, None, self.state_dim, "state"),
               "actions": _rows(action, None, self.action_dim, "action"),
               "rewards": _rows(float(reward), None, 1, "reward"),
               "next_states": _rows(next_state, None, self.state_dim, "next_state"),
               "dones": _rows(float(bool(done)), None, 1, "done"),
               "hiddens": _rows(hidden, None, self.hidden_dim, "hidden")}
        self._core.add(row)

    def add_multi(self, states: Any, actions: Any, rewards: Any, next_states: Any, dones: Any,
                  hiddens: Any) -> None:
        """Add a batch of ``B`` transitions; more than ``capacity`` keep the last ones."""
        n = len(states)
        batch = {"states": _rows(states, n, self.state_dim, "states"),
                 "actions": _rows(actions, n, self.action_dim, "actions"),
                 "rewards": _rows(rewards, n, 1, "rewards"),
                 "next_states": _rows(next_states, n, self.state_dim, "next_states"),
                 "dones": _rows(dones, n, 1, "dones"),
                 "hiddens": _rows(hiddens, n, self.hidden_dim, "hiddens")}
        cap = self.capacity
        if n > cap:  # velora's position moves by n: write (n - cap) % cap rows the last cap then cover
            k = (n - cap) % cap
            if k:
                self._core.extend({f: a[n - cap - k:n - cap] for f, a in batch.items()})
            batch = {f: a[n - cap:] for f, a in batch.items()}
        self._core.extend(batch)

    # -- reading -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._core)

    @property
    def position(self) -> int:
        """The slot the next transition goes to (velora's ``position``)."""
        return self._position_size()[0]

    @property
    def size(self) -> int:
        """Transitions held, at most ``capacity`` (velora's ``size``)."""
        return self._position_size()[1]

    def _storage(self, field: str) -> Any:
        """The full-capacity ``(capacity, dim)`` float32 tensor of ``field``, in slot order:
        a zero-copy view of the shared memory on the CPU (a copy on another ``device``),
        which keeps the memory mapped while it lives (after :meth:`close` too)."""
        engine = self._core.engine
        a = engine.view(field)
        mapping = np.frombuffer(engine.seg.mmap, np.uint8)  # (holds the mapping while the view lives)
        offset = a.__array_interface__["data"][0] - mapping.__array_interface__["data"][0]
        view = _torch().from_numpy(np.ndarray(a.shape, a.dtype, mapping, offset, a.strides))
        return view if self.device.type == "cpu" else view.to(self.device)

    states = property(lambda self: self._storage("states"), doc="velora's ``states`` storage (see ``_storage``).")
    actions = property(lambda self: self._storage("actions"), doc="velora's ``actions`` storage.")
    rewards = property(lambda self: self._storage("rewards"), doc="velora's ``rewards`` storage ``(C, 1)``.")
    next_states = property(lambda self: self._storage("next_states"), doc="velora's ``next_states`` storage.")
    dones = property(lambda self: self._storage("dones"), doc="velora's ``dones`` storage ``(C, 1)``.")
    hiddens = property(lambda self: self._storage("hiddens"), doc="velora's ``hiddens`` storage.")

    def sample(self, batch_size: int) -> BatchExperience:
        """``batch_size`` transitions uniformly with replacement, as float32 tensors on
        ``device``. ``ValueError`` if fewer are stored."""
        if len(self) < batch_size:
            raise ValueError(f"Buffer does not contain enough experiences. Available: {len(self)}, "
                             f"Requested: {batch_size}")
        torch = _torch()
        s = self._core.sample(batch_size)
        return BatchExperience(**{k: torch.from_numpy(s[k]).to(self.device) for k in FIELDS})

    def config(self) -> Any:
        """velora's ``BufferConfig`` where velora is installed, else a dict of the same fields."""
        fields = {"type": "ReplayBuffer", "capacity": self.capacity, "state_dim": self.state_dim,
                  "action_dim": self.action_dim, "hidden_dim": self.hidden_dim}
        try:
            from velora.models.config import BufferConfig
        except ImportError:
            return fields
        return BufferConfig(**fields)

    # -- state, save and load --------------------------------------------------------------

    def _position_size(self) -> tuple[int, int]:
        head = int(self._core.total_added)
        return head % self.capacity, min(len(self), self.capacity)

    def metadata(self) -> dict[str, Any]:
        position, size = self._position_size()
        return {"capacity": self.capacity, "state_dim": self.state_dim, "action_dim": self.action_dim,
                "hidden_dim": self.hidden_dim, "position": position, "size": size,
                "device": None if self._device_given is None else str(self.device)}

    def state_dict(self) -> dict[str, Any]:
        """The six full-capacity float32 tensors in slot order (copies; unused rows zero)."""
        torch = _torch()
        state = self._core.state_dict()
        return {k: torch.from_numpy(np.where(state["stamps"][:, None] > 0, state["data"][k], 0).astype(np.float32))
                for k in FIELDS}

    def save(self, dirpath: str | os.PathLike, prefix: str = "buffer_") -> None:
        """Write ``<prefix>state.safetensors`` and ``<prefix>metadata.json`` into ``dirpath``."""
        d = Path(dirpath)
        d.mkdir(parents=True, exist_ok=True)
        meta = self.metadata()
        _write_safetensors(d / f"{prefix}state.safetensors", {k: t.numpy() for k, t in self.state_dict().items()})
        (d / f"{prefix}metadata.json").write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, state_path: str | os.PathLike, metadata: dict[str, Any], **kwargs: Any) -> "ReplayBuffer":
        """A buffer holding a saved state: ``state_path``'s suffix becomes
        ``.safetensors``; ``metadata`` is the parsed ``metadata.json``."""
        cap, position, size = int(metadata["capacity"]), int(metadata["position"]), int(metadata["size"])
        if not 0 <= size <= cap or not 0 <= position < max(cap, 1) or (size < cap and position != size):
            raise ValueError(f"metadata: position {position} and size {size} do not fit capacity {cap}")
        arrays = _read_safetensors(Path(state_path).with_suffix(".safetensors"))
        buf = cls(cap, int(metadata["state_dim"]), int(metadata["action_dim"]), int(metadata["hidden_dim"]),
                  device=metadata.get("device") or "cpu", **kwargs)
        try:
            fields = buf.core.engine.layout.stored()
            for k, (shape, _) in fields.items():
                if k not in arrays or arrays[k].shape != (cap,) + shape:
                    raise ValueError(f"{state_path}: {k!r} must be float32 {(cap,) + shape}, got "
                                     f"{getattr(arrays.get(k), 'shape', 'nothing')}")
            # the rows at the slots velora had them: the oldest at `position` when full
            seq = np.arange(cap) if size < cap else np.where(np.arange(cap) >= position, np.arange(cap),
                                                               np.arange(cap) + cap)
            stamps = np.where(np.arange(cap) < size, published(seq), 0) if size < cap else published(seq)
            head = size if size < cap else cap + position
            buf.core.load_state_dict({
                "format": "shmbuf.Buffer", "version": 1, "fields": fields, "capacity": cap, "lanes": 1,
                "heads": np.array([head]), "bases": np.array([0]), "stamps": stamps,
                "data": {k: arrays[k] for k in fields}, "rng": buf.core.engine.rng.bit_generator.state})
        except BaseException:
            buf.unlink()
            buf.close()
            raise
        return buf

    def warm(self, agent: Any, n_samples: int, num_envs: int = 8) -> None:
        """Fill the buffer to ``n_samples`` transitions (at most its capacity) from
        ``agent`` acting in ``num_envs`` copies of its environment (gymnasium's sync
        vector env of ``agent.env.spec.id``): ``actions, hidden = agent.predict(states,
        hidden)``, then ``add_multi`` of each step."""
        if num_envs < 2:
            raise ValueError(f"num_envs must be at least 2, got {num_envs}")
        import gymnasium as gym

        torch = _torch()
        target = min(int(n_samples), self.capacity)
        envs = gym.make_vec(agent.env.spec.id, num_envs=num_envs, vectorization_mode="sync")
        try:
            states, _ = envs.reset()
            hidden = None
            while len(self) < target:
                actions, hidden = agent.predict(torch.as_tensor(states, dtype=torch.float32), hidden)
                acts = actions.detach().cpu().numpy() if hasattr(actions, "detach") else np.asarray(actions)
                next_states, rewards, terminated, truncated, _ = envs.step(acts)
                h = np.zeros((num_envs, self.hidden_dim), np.float32) if hidden is None else hidden
                self.add_multi(states, acts.reshape(num_envs, -1), rewards, next_states,
                               np.logical_or(terminated, truncated), h)
                states = next_states
        finally:
            envs.close()


_ST_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "BOOL": np.bool_,
              "U8": np.uint8, "F16": np.float16, "I8": np.int8, "I16": np.int16}


def _write_safetensors(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """A safetensors file: u64 header length, JSON header, raw little-endian data."""
    names = {v: k for k, v in _ST_DTYPES.items()}
    header, offset, blobs = {}, 0, []
    for k, a in arrays.items():
        a = np.ascontiguousarray(a, a.dtype.newbyteorder("<"))
        blob = a.tobytes()
        header[k] = {"dtype": names[a.dtype.type], "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file, every number in its header checked."""
    data = path.read_bytes()
    if len(data) < 8:
        raise ValueError(f"{str(path)!r} is not a safetensors file (too short)")
    (n,) = struct.unpack_from("<Q", data)
    if n > len(data) - 8:
        raise ValueError(f"{str(path)!r}: header of {n} bytes does not fit in the file")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as exc:
        raise ValueError(f"{str(path)!r}: bad header ({exc})") from None
    body = memoryview(data)[8 + n:]
    out = {}
    for k, spec in header.items():
        if k == "__metadata__":
            continue
        try:
            dtype = np.dtype(_ST_DTYPES[spec["dtype"]]).newbyteorder("<")
            shape = tuple(int(x) for x in spec["shape"])
            lo, hi = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{str(path)!r}: bad entry for {k!r}: {spec!r}"[:300]) from None
        if not 0 <= lo <= hi <= len(body) or hi - lo != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{str(path)!r}: {k!r} claims bytes {lo}..{hi} for {shape} {dtype}")
        out[k] = np.frombuffer(body[lo:hi], dtype).reshape(shape).astype(dtype.newbyteorder("="))
    return out
