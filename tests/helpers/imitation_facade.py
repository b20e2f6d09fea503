"""A pytest plugin that runs imitation's own buffer tests with shmbuf's facade in place
of imitation's buffers (``scripts/test-libraries``: ``-p imitation_facade``).

imitation's ``tests/data/test_buffer.py`` imports ``Buffer`` and ``ReplayBuffer`` from
``imitation.data.buffer``: both names are bound to :mod:`shmbuf.compat.imitation`'s
classes before any test module is imported, so every buffer those tests make is a
shared-memory one, read through the facade's views of imitation's private attributes
(``_idx``, ``_arrays``, ``_n_data``, ``ReplayBuffer._buffer``).
"""

from __future__ import annotations

import pytest

import library_namespace


def pytest_configure(config: pytest.Config) -> None:
    # a namespace of this run's own: any buffer left at the end fails the run
    library_namespace.enter("imitation")
    from imitation.data import buffer

    from shmbuf.compat import imitation

    buffer.Buffer, buffer.ReplayBuffer = imitation.Buffer, imitation.ReplayBuffer


def pytest_report_header(config: pytest.Config) -> str:
    return "imitation_facade: imitation.data.buffer's Buffer and ReplayBuffer are shmbuf's"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    library_namespace.check(session, "imitation")
