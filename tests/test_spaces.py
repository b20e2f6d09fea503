"""shmbuf.spaces with real gymnasium spaces (an optional extra)."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf
from shmbuf.spaces import fields_from_spaces, flatten, observation_keys, space_fields, unflatten

gym = pytest.importorskip("gymnasium", reason="gymnasium is an optional extra: pip install gymnasium")
from gymnasium import spaces  # noqa: E402

pytestmark = pytest.mark.extras

NESTED = spaces.Dict({
    "camera": spaces.Box(0, 255, (4, 4, 3), np.uint8),
    "joints": spaces.Tuple((spaces.Box(-1, 1, (7,), np.float64), spaces.MultiBinary(3))),
    "mode": spaces.Discrete(5),
    "target": spaces.Dict({"cell": spaces.MultiDiscrete([3, 4])}),
})


def test_leaf_spaces_map_to_their_shape_and_dtype():
    got = fields_from_spaces(spaces.Box(-1, 1, (17,)), spaces.Box(-1, 1, (6,)), next_obs=True, done=True)
    assert got == {"obs": ((17,), np.float32), "next_obs": ((17,), np.float32), "action": ((6,), np.float32),
                   "reward": ((), np.float32), "terminated": ((), np.bool_), "truncated": ((), np.bool_)}
    assert space_fields(spaces.Discrete(3), "a") == {"a": ((), np.int64)}
    assert space_fields(spaces.MultiDiscrete([2, 3, 4]), "a") == {"a": ((3,), np.int64)}
    assert space_fields(spaces.MultiBinary((2, 3)), "a") == {"a": ((2, 3), np.int8)}


def test_nested_spaces_use_dotted_paths():
    got = fields_from_spaces(NESTED, spaces.Discrete(2), reward=None)
    assert list(got) == ["obs.camera", "obs.joints.0", "obs.joints.1", "obs.mode", "obs.target.cell", "action"]
    assert got["obs.joints.1"] == ((3,), np.int8) and got["obs.target.cell"] == ((2,), np.int64)
    assert observation_keys(got) == list(got)[:5]
    with pytest.raises(ValueError, match="without '.'"):
        space_fields(spaces.Dict({"a.b": spaces.Discrete(2)}), "obs")
    with pytest.raises(TypeError, match="cannot be stored"):
        fields_from_spaces(spaces.Text(5))


def test_nested_observations_round_trip_through_an_episode_buffer(name):
    fields = fields_from_spaces(NESTED, spaces.Discrete(2))
    NESTED.seed(0)
    with shmbuf.EpisodeBuffer.create(fields, 64, observations=observation_keys(fields), name=name, seed=0) as buf:
        obs = [NESTED.sample() for _ in range(4)]
        steps = {k: np.stack([flatten({"obs": o})[k] for o in obs[:3]]) for k in observation_keys(fields)}
        steps.update({"action": [0, 1, 0], "reward": [1.0, 2.0, 3.0]})
        steps.update({f"next_{k}": v for k, v in flatten({"obs": obs[3]}).items()})
        buf.add_episode(steps, terminated=True)
        batch = buf.sample(20)
        nested = unflatten(batch, obs=NESTED, next_obs=NESTED)
        assert isinstance(nested["obs"]["joints"], tuple) and list(nested["obs"]) == list(NESTED.spaces)
        assert nested["obs"]["camera"].shape == (20, 4, 4, 3) and nested["obs"]["camera"].dtype == np.uint8
        assert nested["obs"]["joints"][1].dtype == np.int8
        for i in range(20):  # every sampled step is one of the written ones, whole, nesting kept
            one = {k: v[i] for k, v in batch.items() if k.startswith("obs")}
            match = [j for j, o in enumerate(obs[:3])
                     if all(np.array_equal(one[k], v) for k, v in flatten({"obs": o}).items())]
            assert len(match) == 1
            nxt = {k[5:]: v[i] for k, v in batch.items() if k.startswith("next_obs")}
            want = flatten({"obs": obs[match[0] + 1]})
            assert all(np.array_equal(nxt[k], want[k]) for k in want)
            assert NESTED.contains(unflatten(one, obs=NESTED)["obs"])
