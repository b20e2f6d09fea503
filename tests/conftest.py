"""Fixtures shared by the suite.

The whole run lives in its own namespace (``SHMBUF_NAMESPACE``, inherited by every
child process, spawned or not), so every segment the suite makes is named
``shmbuf@<run>-<name>`` and nothing else on the machine is ever seen, touched or
removed by it: other programs' buffers and other runs of this suite are left alone.
Every test gets a fresh buffer name and must leave no segment behind; the session
checks the run's namespace as a whole at the end."""

from __future__ import annotations

import gc
import getpass
import os
import signal
import tempfile
import uuid

import pytest

from shmbuf.core import segment

# The core step of scripts/test does not collect the optional extras' test files: their
# dependencies may be being installed meanwhile. The reference libraries' tests run only
# in scripts/test-libraries (a virtualenv per library).
collect_ignore = [] if os.environ.get("SHMBUF_TEST_STEP") == "libraries" else \
    ["test_libraries.py", "compat/test_compat_sb3.py", "compat/test_compat_torchrl.py"]
# the plugins that run a library's own tests on a facade (test-libraries: -p <name>)
collect_ignore += ["helpers/sb3_facade.py", "helpers/imitation_facade.py", "helpers/library_namespace.py"]
if os.environ.get("SHMBUF_TEST_STEP") != "ray":  # (scripts/test-ray: a virtualenv with Ray)
    collect_ignore += ["ray/test_ray.py"]
if os.environ.get("SHMBUF_TEST_STEP") == "core":
    collect_ignore += ["test_torch.py", "test_spaces.py", "test_hdf5.py", "test_examples.py", "compat/test_compat_velora.py",
                       "compat/test_compat_d3rlpy_dump.py", "ragged/test_ragged_arrow.py", "ragged/test_ragged_safetensors.py"]

# A run started in the background of a shell without job control inherits SIGINT
# ignored, and so would every process it starts: the tests of Ctrl-C (real SIGINTs)
# need Python's own handler, as a terminal gives it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Child processes that import this module (spawn re-imports test modules) keep the
# run's namespace; a new run never inherits one from the shell.
RUN = os.environ.get("SHMBUF_TEST_RUN") or f"test{os.getpid()}-{uuid.uuid4().hex[:8]}"
os.environ["SHMBUF_TEST_RUN"] = os.environ[segment.NAMESPACE_ENV] = RUN


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments():
    assert segment.prefix() == f"shmbuf@{RUN}-"
    yield
    gc.collect()
    leaked = segment.list_names()  # only this run's namespace: all of it is ours
    for name in leaked:
        segment.unlink_name(name)
    assert not leaked, f"the suite left shared-memory segments behind: {sorted(leaked)}"


@pytest.fixture(scope="session", autouse=True)
def no_leaked_temp_files():
    """Under scripts/test the run has a temporary directory of its own (``TMPDIR``, named
    in ``SHMBUF_TEST_TMPDIR``): whatever a test, a doctest, a docs page or a child
    process leaves there fails the session. Not counted: pytest's own ``pytest-of-<user>``,
    torch's compile cache ``torchinductor_<user>`` (torch makes it) and this process's
    ``pymp-*`` (multiprocessing removes it at exit; scripts/test checks the directory
    again once every process is gone)."""
    tmp = tempfile.gettempdir()
    mine = os.environ.get("SHMBUF_TEST_TMPDIR") == tmp
    before = set(os.listdir(tmp)) if mine else set()
    yield
    if mine:
        gc.collect()
        user = getpass.getuser()
        left = {n for n in set(os.listdir(tmp)) - before
                if n not in (f"pytest-of-{user}", f"torchinductor_{user}") and not n.startswith("pymp-")}
        assert not left, f"the suite left files in {tmp}: {sorted(left)}"


def pytest_generate_tests(metafunc):
    """Tests marked ``both_storages`` run twice: on a buffer in ``/dev/shm`` and on a
    buffer in a file (their ``name`` fixture is then a path)."""
    if metafunc.definition.get_closest_marker("both_storages") and "storage" in metafunc.fixturenames:
        metafunc.parametrize("storage", ["shm", "file"], indirect=True)


@pytest.fixture
def storage(request):
    """Where the test's buffer lives: "shm" (default) or "file" (see both_storages)."""
    return getattr(request, "param", "shm")


@pytest.fixture
def name(request, storage, tmp_path_factory):
    """A unique buffer name (for ``storage == "file"`` the path of a file in a fresh
    directory); the test fails if a segment of that name outlives it."""
    n = f"t{os.getpid()}-{uuid.uuid4().hex[:10]}"
    if storage == "file":
        yield str(tmp_path_factory.mktemp("file") / f"{n}.shmbuf")
        return
    yield n
    gc.collect()
    if segment.unlink_name(n):
        pytest.fail(f"test left segment {n!r} in /dev/shm", pytrace=False)


def pytest_report_header(config):
    from shmbuf.core import native
    return f"shmbuf path: {native.path()} (SHMBUF_PURE_PYTHON=1 selects pure Python)"


@pytest.fixture
def set_hook():
    """``ring.set_hook`` (both paths), reset after the test."""
    from shmbuf.core import ring
    yield ring.set_hook
    ring.set_hook(None)


@pytest.fixture
def break_protection(monkeypatch):
    """``break_protection("stamp check")`` or ``("waiting")``: switch a protection off
    on purpose, on both paths (in this process and the children it forks), to prove
    that a stress test would see what it protects against."""
    from shmbuf.core import gather, native, ring

    def brk(what):
        if what == "stamp check":
            monkeypatch.setattr(gather, "FAULTS", 1)
            bits = 1
        else:
            monkeypatch.setattr(ring.Ring, "_older_done", lambda self, first, runs: True)
            monkeypatch.setattr(ring.Ring, "_wait_for_older", lambda self, *a: None)
            bits = 2
        if native.available():
            native.extension().set_faults(bits)
    yield brk
    if native.available():
        native.extension().set_faults(0)


MUJOCO = {"obs": ((17,), "float32"), "action": ((6,), "float32"),
          "reward": ((), "float32"), "done": ((), "bool")}


def shm_path(name: str) -> str:
    """Where the segment of buffer ``name`` lives (this run's namespace)."""
    return segment.SHM_DIR + segment.os_name(name)


# Doctests of the optional-dependency modules: marked "extras" (scripts/test runs them in
# a step of their own) and skipped where the dependency is not installed.
OPTIONAL_DOCTESTS = {"shmbuf/torch.py": "torch", "shmbuf/spaces.py": "gymnasium", "shmbuf/hdf5.py": "h5py",
                     "shmbuf/ragged/arrow.py": "pyarrow", "shmbuf/actors/weights.py": None, "shmbuf/compat/velora.py": "torch"}


def pytest_collection_modifyitems(config, items):
    import importlib.util

    for item in items:
        path = str(getattr(item, "path", "")).replace(os.sep, "/")
        key = next((k for k in OPTIONAL_DOCTESTS if path.endswith("/" + k)), None)
        if type(item).__name__ != "DoctestItem" or key is None:
            continue
        item.add_marker(pytest.mark.extras)
        need = OPTIONAL_DOCTESTS[key]
        if need and importlib.util.find_spec(need) is None:
            item.add_marker(pytest.mark.skip(reason=f"{need} is not installed (an optional extra)"))
