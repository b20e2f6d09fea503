"""What ``pip install .`` (not editable) gives a user: every subpackage, a working
``shmbuf`` command and the README example, run from a fresh virtual environment."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import numpy
import psutil
import pytest

pytestmark = pytest.mark.one_path  # (scripts/test runs it on one path)

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    src = tmp_path / "src"  # a clean copy: no build/ left over from an earlier build
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "site", "build", "dist", "*.egg-info", "results", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True,
                   timeout=240, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("shmbuf-*.whl"))
    packaged = set(zipfile.ZipFile(wheel).namelist())
    for init in ROOT.glob("shmbuf/**/__init__.py"):
        assert init.relative_to(ROOT).as_posix() in packaged, f"the wheel leaves out {init}"

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    str(wheel)], check=True, capture_output=True, timeout=240)
    # numpy and psutil come from this environment (no network in tests); shmbuf must not
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = {pathlib.Path(m.__file__).parent.parent for m in (numpy, psutil)}
    pathlib.Path(purelib, "deps.pth").write_text("\n".join(map(str, deps)) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    where = subprocess.run([str(py), "-c", "import shmbuf; print(shmbuf.__file__)"],
                           capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(venv)), f"shmbuf was not imported from the wheel: {where.stdout}"
    meta = zipfile.ZipFile(wheel).read(next(n for n in packaged if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in meta and "Classifier: Operating System :: POSIX :: Linux" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in packaged)
    assert all(f"Provides-Extra: {e}" in meta for e in ("sb3", "torchrl", "bench", "all"))
    for args in (["--help"], ["--version"], ["demo", "--help"], ["doctor"]):
        res = subprocess.run([str(venv / "bin" / "shmbuf"), *args], capture_output=True, text=True,
                             env=env, timeout=120)
        assert res.returncode == 0, (args, res.stderr)
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    (tmp_path / "example.py").write_text(code)  # spawn re-imports __main__ from its file
    res = subprocess.run([str(py), "example.py"], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1000 (256, 4) True"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_sdist_holds_what_a_build_needs_and_builds_alone(tmp_path):
    """The sdist carries the package, the C sources, the license and no tests (they run
    from a clone), and a wheel builds from it alone."""
    import tarfile

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "site", "build", "dist", "*.egg-info", "results", "__pycache__"))
    subprocess.run([sys.executable, "-c", "import setuptools.build_meta as b, sys; b.build_sdist(sys.argv[1])",
                    str(tmp_path / "sdist")], check=True, capture_output=True, timeout=240, cwd=src)
    sdist = next((tmp_path / "sdist").glob("shmbuf-*.tar.gz"))
    names = [n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n]
    assert "LICENSE" in names and "shmbuf/core/_native.c" in names and "shmbuf/core/csrc/ring.h" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/", "docs/"))]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(sdist)], check=True, capture_output=True,
                   timeout=240, cwd=tmp_path)
    assert list((tmp_path / "dist").glob("shmbuf-*.whl"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_build_without_a_c_compiler_succeeds_and_says_so_in_one_line(tmp_path):
    """No compiler (CC=/bin/false): the wheel still builds, without the extension, and
    the build says which path shmbuf will run and what to do, in one line."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "site", "docs", "tests", "build", "dist", "*.egg-info", "results", "__pycache__", "*.so"))
    res = subprocess.run([sys.executable, "-c", "import setuptools.build_meta as b, sys; b.build_wheel(sys.argv[1])",
                          str(tmp_path / "dist")], capture_output=True, text=True, timeout=240, cwd=src,
                         env={**os.environ, "CC": "/bin/false"})
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("shmbuf: the C extension")]
    assert len(said) == 1 and "pure-Python path" in said[0] and "C compiler" in said[0], res.stderr
    wheel = next((tmp_path / "dist").glob("shmbuf-*.whl"))
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]


def test_import_shmbuf_imports_no_optional_dependency():
    code = ("import sys, shmbuf, shmbuf.spaces, shmbuf.persist.save, shmbuf.torch, shmbuf.actors.weights, shmbuf.cli, "
            "shmbuf.hdf5, shmbuf.ragged.arrow, shmbuf.compat.imitation, shmbuf.compat.fishyrl, shmbuf.compat.velora\n"
            "bad = {'torch', 'gymnasium', 'gym', 'h5py', 'safetensors', 'ray', 'pyarrow'} & set(sys.modules)\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
