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


def test_readme_is_short_and_its_links_resolve():
    """The README stays a page (the documentation is the site in docs/), and every
    relative link in it names a file of the repository."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert any(l.startswith("docs/") for l in links)
    missing = [l for l in links if "://" not in l and not (README.parent / l).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
