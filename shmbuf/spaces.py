"""Gymnasium spaces as fields, and nested observations to and from flat batches.

gymnasium is optional: nothing here imports it (spaces are recognised by their class
names and attributes), so these functions also take gym's spaces.

**Naming rule.** A buffer's fields are flat, so a nested space becomes one field per
leaf, named by its path joined with dots: ``Dict(position=Box, target=Dict(xy=Box))``
under ``obs`` gives ``obs.position`` and ``obs.target.xy``; a ``Tuple`` uses the
indices: ``obs.0``, ``obs.1``. Leaf spaces map to ``(shape, dtype)`` from the space:

====================  ======================================
Box(low, high, shape)  ``(shape, space.dtype)``
Discrete(n)            ``((), space.dtype)`` (int64)
MultiDiscrete(nvec)    ``(nvec.shape, space.dtype)`` (int64)
MultiBinary(n)         ``(shape, space.dtype)`` (int8)
====================  ======================================

:func:`flatten` turns nested values (dicts, tuples) into such flat keys for ``add``;
:func:`unflatten` turns a sampled batch back into the nesting (tuples back into tuples
when given the space).

Examples:
    >>> from gymnasium import spaces
    >>> obs = spaces.Dict({"pos": spaces.Box(-1, 1, (3,)), "grip": spaces.Discrete(2)})
    >>> fields_from_spaces(obs, spaces.Discrete(4))  # doctest: +NORMALIZE_WHITESPACE
    {'obs.grip': ((), dtype('int64')), 'obs.pos': ((3,), dtype('float32')),
     'action': ((), dtype('int64')), 'reward': ((), dtype('float32'))}
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

SEP = "."
_LEAVES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary")


def _kind(space: Any) -> str:
    for cls in type(space).__mro__:
        if cls.__name__ in _LEAVES + ("Dict", "Tuple") and "gym" in cls.__module__:
            return cls.__name__
    raise TypeError(f"{type(space).__name__} spaces cannot be stored as fields (shmbuf stores Box, "
                    "Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of them); got "
                    f"{space!r}"[:300])


def space_fields(space: Any, prefix: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The fields of one (possibly nested) space, named ``prefix`` and ``prefix.<path>``."""
    kind = _kind(space)
    if kind == "Dict":
        out = {}
        for key, sub in space.spaces.items():
            if not isinstance(key, str) or not key or SEP in key:
                raise ValueError(f"Dict space key {key!r} under {prefix!r}: keys must be non-empty "
                                 f"strings without {SEP!r} (it joins the path of a nested field)")
            out.update(space_fields(sub, f"{prefix}{SEP}{key}"))
        return out
    if kind == "Tuple":
        out = {}
        for i, sub in enumerate(space.spaces):
            out.update(space_fields(sub, f"{prefix}{SEP}{i}"))
        return out
    return {prefix: (tuple(int(d) for d in space.shape), np.dtype(space.dtype))}


def fields_from_spaces(observation_space: Any, action_space: Any = None, *,
                       reward: Any = np.float32, next_obs: bool = False,
                       done: bool = False) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Fields for a buffer of transitions of an env with these spaces.

    Gives the observation's fields (``obs`` or ``obs.<path>``), the action's (``action``
    or ``action.<path>``) and ``reward`` (``reward=None`` leaves it out): what
    :class:`shmbuf.EpisodeBuffer` needs (it adds ``next_obs`` and the episode flags
    itself; pass ``observations=observation_keys(fields)``). For a plain
    :class:`shmbuf.Buffer` of transitions add ``next_obs=True`` (``next_obs...``
    fields) and ``done=True`` (``terminated`` and ``truncated``, bool).
    """
    fields = space_fields(observation_space, "obs")
    if next_obs:
        fields.update(space_fields(observation_space, "next_obs"))
    if action_space is not None:
        fields.update(space_fields(action_space, "action"))
    if reward is not None:
        fields["reward"] = ((), np.dtype(reward))
    if done:
        fields["terminated"] = ((), np.dtype(bool))
        fields["truncated"] = ((), np.dtype(bool))
    return fields


def observation_keys(fields: Mapping[str, Any], prefix: str = "obs") -> list[str]:
    """The fields that hold the observation: ``prefix`` and ``prefix.<path>``."""
    return [k for k in fields if k == prefix or k.startswith(prefix + SEP)]


def flatten(values: Mapping[str, Any]) -> dict[str, Any]:
    """``{"obs": {"pos": a, "grip": b}, "action": c}`` -> ``{"obs.pos": a, "obs.grip":
    b, "action": c}``: dicts and tuples (lists) of arrays become dotted keys; arrays
    (any leading axes) are left as they are.

    Examples:
        >>> flatten({"obs": {"pos": [0.1, 0.2], "pair": (1, 2)}, "reward": 1.0})
        {'obs.pos': [0.1, 0.2], 'obs.pair.0': 1, 'obs.pair.1': 2, 'reward': 1.0}
    """
    out: dict[str, Any] = {}

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, Mapping):
            for k, sub in v.items():
                if not isinstance(k, str) or SEP in k:
                    raise ValueError(f"key {k!r} under {prefix!r}: keys must be strings without {SEP!r}")
                walk(f"{prefix}{SEP}{k}", sub)
        elif isinstance(v, tuple):
            for i, sub in enumerate(v):
                walk(f"{prefix}{SEP}{i}", sub)
        else:
            out[prefix] = v

    for key, v in values.items():
        walk(key, v)
    return out


def unflatten(batch: Mapping[str, Any], **spaces: Any) -> dict[str, Any]:
    """A flat batch back into its nesting: dotted keys become nested dicts; where a
    space is given for a top-level key (``obs=env.observation_space``), a ``Tuple``
    space's part comes back as a tuple, and the keys keep the space's order.

    Examples:
        >>> b = unflatten({"obs.pos": 1, "obs.vel": 2, "reward": 3})
        >>> b
        {'obs': {'pos': 1, 'vel': 2}, 'reward': 3}
        >>> flatten(b)
        {'obs.pos': 1, 'obs.vel': 2, 'reward': 3}
    """
    root: dict[str, Any] = {}
    for key, v in batch.items():
        parts = key.split(SEP)
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"key {key!r} nests under {p!r}, which is also a field of its own")
        node[parts[-1]] = v
    for top, space in spaces.items():
        if top in root:
            root[top] = _shape_like(root[top], space, top)
    return root


def _shape_like(node: Any, space: Any, path: str) -> Any:
    kind = _kind(space)
    if kind in _LEAVES:
        return node
    if not isinstance(node, dict):
        raise ValueError(f"{path!r} is one field, but the space given for it is a {kind}")
    if kind == "Dict":
        return {k: _shape_like(node[k], sub, f"{path}{SEP}{k}") for k, sub in space.spaces.items()}
    return tuple(_shape_like(node[str(i)], sub, f"{path}{SEP}{i}") for i, sub in enumerate(space.spaces))
