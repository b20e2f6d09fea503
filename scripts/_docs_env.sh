# Sourced by scripts/docs and scripts/plots: the virtualenv .venv-docs with the pinned
# documentation tools of docs/requirements.txt (MkDocs, Material, mkdocstrings, matplotlib).
DOCS_VENV="${DOCS_VENV:-.venv-docs}"
docs_stamp="$DOCS_VENV/.shmbuf-docs-installed"
if [ ! -f "$docs_stamp" ] || [ docs/requirements.txt -nt "$docs_stamp" ]; then
  echo "scripts: installing the documentation tools (docs/requirements.txt) into $DOCS_VENV" >&2
  [ -x "$DOCS_VENV/bin/python" ] || python3 -m venv "$DOCS_VENV"
  "$DOCS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r docs/requirements.txt 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  "$DOCS_VENV/bin/python" -c "import mkdocs, material, mkdocstrings_handlers.python, matplotlib"
  touch "$docs_stamp"
fi
