"""The facades that subclass a library's classes (SB3, TorchRL), imported without that
library: a ModuleNotFoundError that names the extra to install (round 4: a bare
``ModuleNotFoundError: torch``). Runs in the core suite: each library is made
unimportable in a fresh interpreter (``sys.modules[name] = None``), installed or not."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.one_path

FACADES = {"shmbuf.compat.sb3": ("sb3", ("torch", "gymnasium", "stable_baselines3")),
           "shmbuf.compat.torchrl": ("torchrl", ("torch", "tensordict", "torchrl"))}

PROBE = """
import json, sys
sys.modules[sys.argv[2]] = None  # (as if not installed)
try:
    __import__(sys.argv[1])
except ImportError as exc:
    print(json.dumps({"type": type(exc).__name__, "module_not_found": isinstance(exc, ModuleNotFoundError),
                      "message": str(exc), "name": exc.name}))
"""


@pytest.mark.parametrize("facade,missing", [(f, m) for f, (_, mods) in FACADES.items() for m in mods])
def test_a_facade_without_its_library_says_which_extra_installs_it(facade, missing):
    extra, modules = FACADES[facade]
    res = subprocess.run([sys.executable, "-c", PROBE, facade, missing], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    # the first of the facade's modules that cannot be imported here: the one made so, or one not installed
    first = next(m for m in modules if m == missing or importlib.util.find_spec(m) is None)
    assert got["type"] == "ModuleNotFoundError" and got["module_not_found"] and got["name"] == first
    assert got["message"].startswith(f"{facade} needs {', '.join(modules[:-1])} and {modules[-1]}, which shmbuf's "
                                     f"extra {extra!r} installs: pip install 'shmbuf[{extra}]' ("), got["message"]
    assert (f"import of {first} halted" if first == missing else f"No module named '{first}'") in got["message"]


def test_the_extras_named_exist():
    """The extras the messages name are in pyproject.toml, with the libraries."""
    try:
        import tomllib
    except ModuleNotFoundError:  # (Python < 3.11)
        pytest.skip("tomllib is Python 3.11's")
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(r.startswith("stable-baselines3") for r in extras["sb3"])
    assert any(r.startswith("torchrl") for r in extras["torchrl"])
    assert any(r.startswith("tensordict") for r in extras["torchrl"])
