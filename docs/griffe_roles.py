"""A griffe extension for the API pages (scripts/docs): the docstrings use Sphinx's roles
(``:meth:`add` ``, ``:class:`shmbuf.Buffer` ``), which read well in ``help()`` but are
not Markdown; on the site each becomes inline code of its target's last name."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:meth|class|func|data|mod|attr|exc|obj):`~?([^`]+)`")


def _inline(match: re.Match) -> str:
    target = match.group(1)
    return f"`{target.rsplit('.', 1)[-1] if target.startswith('shmbuf.') else target}`"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_inline, obj.docstring.value)
