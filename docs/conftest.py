"""Every ``python`` code block of the documentation runs in the suite (sybil).

The blocks of a page run in order in one namespace, in a fresh directory of their own
(files a block saves land there), in the suite's shared-memory namespace, and the page
must leave no segment behind. A block with ``if __name__ == "__main__":`` is a program
(its workers are started with spawn, which imports the main module): it runs as a script
in a fresh interpreter and must exit 0 with nothing on stderr. A page that needs an
optional dependency (``EXTRAS`` below) is marked ``extras`` (scripts/test runs it in that
step) or skips where the dependency is missing (scripts/test-libraries and
scripts/test-ray run those pages in their virtualenvs). ``<!-- skip: next -->`` before a
block leaves it out: only for blocks that are not Python a user runs as is (a shell
session, an excerpt of a longer program that the suite runs whole elsewhere).
"""

from __future__ import annotations

import gc
import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest
from sybil import Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, SkipParser

from shmbuf.core import segment

collect_ignore = ["griffe_roles.py"]  # (scripts/docs' griffe extension: griffe is the site's tool)

RUN = os.environ.get("SHMBUF_TEST_RUN") or f"docs{os.getpid()}-{uuid.uuid4().hex[:8]}"
os.environ["SHMBUF_TEST_RUN"] = os.environ[segment.NAMESPACE_ENV] = RUN

# page -> the module it needs ("extras": torch, gymnasium, h5py are scripts/test's extras step)
# (distributions, not modules: tests/ray would pass for a module "ray" on the tests' path)
EXTRAS = {"guides/torch-gym.md": "torch", "migrate/velora.md": "torch", "guides/ray.md": "ray",
          "migrate/sb3.md": "stable-baselines3", "migrate/cleanrl.md": "stable-baselines3",
          "migrate/torchrl.md": "torchrl"}
EXTRAS_STEP = {"torch", "gymnasium", "h5py"}
ROOT = pathlib.Path(__file__).resolve().parent


class DocEvaluator(PythonEvaluator):
    """Runs a block in the page's namespace, or as a script when it is a program."""

    def __call__(self, example):
        if '__name__ == "__main__"' not in example.parsed:
            return super().__call__(example)
        script = pathlib.Path(example.namespace["tmp_path"]) / f"block_{example.line}.py"
        script.write_text(str(example.parsed))
        res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             timeout=110, cwd=script.parent)
        assert res.returncode == 0 and res.stderr == "", \
            f"{example.path}:{example.line}: the program exited {res.returncode}:\n{res.stderr}"
        return None


def setup(namespace):
    namespace["_cwd"], namespace["tmp_path"] = os.getcwd(), tempfile.mkdtemp(prefix="shmbuf-docs-")
    namespace["_segments"] = set(segment.list_names())  # (a session's fixtures may hold some)
    os.chdir(namespace["tmp_path"])


def teardown(namespace):
    os.chdir(namespace["_cwd"])
    shutil.rmtree(namespace["tmp_path"])
    before = namespace["_segments"]
    namespace.clear()
    gc.collect()
    leaked = sorted(set(segment.list_names()) - before)
    for n in leaked:
        segment.unlink_name(n)
    assert not leaked, f"the page left shared-memory segments behind: {leaked}"


pytest_collect_file = Sybil(
    parsers=[CodeBlockParser(language="python", evaluator=DocEvaluator()), SkipParser()],
    patterns=["*.md"], setup=setup, teardown=teardown,
).pytest()


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = pathlib.Path(str(getattr(item, "path", "")))
        if ROOT not in path.parents:
            continue
        item.add_marker(pytest.mark.one_path)
        need = EXTRAS.get(path.relative_to(ROOT).as_posix())
        if need in EXTRAS_STEP:
            item.add_marker(pytest.mark.extras)
        if need and not _installed(need):
            item.add_marker(pytest.mark.skip(reason=f"needs {need}"))


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False
