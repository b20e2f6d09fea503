"""How every ``shmbuf`` verb reports a problem: one line on stderr."""

from __future__ import annotations

import sys


def problem(command: str, name: str, why: str) -> None:
    """One line on stderr: ``shmbuf COMMAND: NAME: why`` (a name that is not printable
    shown as its repr, so the line stays one line)."""
    shown = name if name.isprintable() else repr(name)
    print(f"shmbuf {command}: {shown}: {why}", file=sys.stderr)
