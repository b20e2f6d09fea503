"""Doctests of the optional-dependency modules: marked ``extras`` (scripts/test runs
them in their own step) and skipped where the dependency is not installed."""

from __future__ import annotations

import importlib.util
import os

import pytest

OPTIONAL = {"torch.py": "torch", "spaces.py": "gymnasium", "hdf5.py": "h5py", "weights.py": None}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if type(item).__name__ != "DoctestItem":
            continue
        base = os.path.basename(str(item.path))
        if base in OPTIONAL and os.path.basename(os.path.dirname(str(item.path))) == "shmbuf":
            item.add_marker(pytest.mark.extras)
            need = OPTIONAL[base]
            if need and importlib.util.find_spec(need) is None:
                item.add_marker(pytest.mark.skip(reason=f"{need} is not installed (an optional extra)"))
