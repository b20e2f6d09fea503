# Sourced by the scripts: use the active virtualenv, or make .venv and install shmbuf
# (editable) with its test extras into it. Re-installs only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "scripts: creating .venv" >&2
    python3 -m venv .venv
  fi
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
stamp="$VIRTUAL_ENV/.shmbuf-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
    || [ shmbuf/core/_native.c -nt "$stamp" ] || [ -n "$(find shmbuf/core/csrc -newer "$stamp" 2>/dev/null)" ] \
    || ! python -c "import shmbuf" 2>/dev/null; then
  echo "scripts: installing shmbuf and its test dependencies into $VIRTUAL_ENV" >&2
  # builds the C extension shmbuf.core._native where a C compiler is present
  python -m pip install --quiet --disable-pip-version-check -e ".[test]" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  python -c "import shmbuf, pytest, pytest_timeout"
  if python -c "import shmbuf.core.native as n; raise SystemExit(not n.available())"; then
    echo "scripts: built the C extension shmbuf.core._native (the native path)" >&2
  else
    echo "scripts: no C extension (no C compiler, or its build failed): shmbuf runs its pure-Python path" >&2
  fi
  touch "$stamp"
fi

# The optional dependencies, for the tests marked "extras" (scripts/test installs them
# once into the virtualenv). torch is pinned first, so nothing pulls another torch.
install_extras() {
  local stamp="$VIRTUAL_ENV/.shmbuf-extras-installed"
  if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] \
      && python -c "import torch, gymnasium, h5py, safetensors, pyarrow" 2>/dev/null; then
    return 0
  fi
  echo "scripts: installing the optional dependencies (torch==2.13.0, gymnasium, h5py, safetensors, pyarrow) into $VIRTUAL_ENV" >&2
  python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  python -m pip install --quiet --disable-pip-version-check -e ".[test,torch,gym,hdf5,safetensors,arrow]" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  python -c "import torch, gymnasium, h5py, safetensors, pyarrow; assert torch.__version__.startswith('2.13.0'), torch.__version__"
  touch "$stamp"
}
