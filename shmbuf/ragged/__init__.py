"""Ragged rows: fields whose length varies from row to row (tokens of a prompt and a
response, per-token logprobs), stored in a byte arena per lane beside the fixed rows
(:mod:`shmbuf.core.arena`) and read back as :class:`~shmbuf.ragged.jagged.Jagged` values
and offsets. See ``docs/guides/ragged.md``."""
