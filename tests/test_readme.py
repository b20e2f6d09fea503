"""The README's example runs as written, in a fresh interpreter."""

from __future__ import annotations

import pytest

import pathlib
import re
import subprocess
import sys

pytestmark = pytest.mark.one_path  # (scripts/test runs it on one path)

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs(tmp_path):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert "Buffer.attach" in code and "Process" in code
    assert len(code.strip().splitlines()) <= 18
    script = tmp_path / "example.py"
    script.write_text(code)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1000 (256, 4) True"
    assert res.stderr == ""


def test_readme_names_the_two_commands():
    head = README.read_text()[:800]
    assert "scripts/demo" in head and "scripts/test" in head


def test_readme_priority_and_her_examples_run(tmp_path):
    """The prioritized DQN-style loop and the HER example run as written (they make
    buffers with fixed names: this run's namespace keeps them apart from others')."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
              if ("update_priorities" in b or "shmbuf.HER(" in b) and "shmbuf.ray" not in b]
    assert len(blocks) == 2
    for i, code in enumerate(blocks):
        script = tmp_path / f"example{i}.py"
        script.write_text(code)
        res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert res.stderr == ""
