"""A batch with ragged fields as safetensors tensors (an optional extra), through the
real safetensors package: ``<name>`` its values and ``<name>.offsets`` its offsets
(shmbuf.ragged.batches.as_arrays), read back equal."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf
from shmbuf.ragged.batches import as_arrays, from_arrays

st = pytest.importorskip("safetensors.numpy", reason="safetensors is an optional extra: pip install 'shmbuf[safetensors]'")

pytestmark = pytest.mark.extras


def test_a_batch_with_ragged_fields_goes_to_safetensors_and_back(name, tmp_path):
    schema = {"r": (("R",), np.int32), "lp": (("R",), np.float32), "p": ((None, 2), np.int16), "k": ((), np.int64)}
    with shmbuf.Buffer.create(schema, 16, name=name, arena=1 << 14, seed=0) as buf:
        buf.extend({"r": [np.full(n, n, np.int32) for n in (3, 0, 5)], "lp": [np.zeros(n) for n in (3, 0, 5)],
                    "p": [np.full((n % 3, 2), n, np.int16) for n in (3, 0, 5)], "k": [3, 0, 5]})
        batch = buf.sample(10)
        st.save_file(as_arrays(batch), str(tmp_path / "b.safetensors"))
        tensors = st.load_file(str(tmp_path / "b.safetensors"))
        assert sorted(tensors) == sorted(["r", "r.offsets", "lp", "lp.offsets", "p", "p.offsets", "k"])
        assert tensors["p.offsets"].dtype == np.int64 and tensors["p"].shape == batch["p"].values.shape
        back = from_arrays(tensors)
        for k in ("r", "lp", "p"):
            assert np.array_equal(back[k].values, batch[k].values) and np.array_equal(back[k].offsets, batch[k].offsets)
        assert np.array_equal(back["k"], batch["k"])
        tensors["r.offsets"] = tensors["r.offsets"].astype(np.int32)  # (damaged: another dtype)
        with pytest.raises(ValueError, match=r"field 'r' \(its values, and 'r.offsets'\): offsets must be int64"):
            from_arrays(tensors)
