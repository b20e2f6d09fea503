"""Rate limits (``Buffer.create(..., rate=RateLimit(...))``): samples per insert held
within a window across every process. :mod:`~shmbuf.rate.limit` holds
:class:`~shmbuf.rate.limit.RateLimit` and the gate that waits before samples and inserts
(:class:`~shmbuf.rate.limit.Limiter`); a buffer without one has the open gate of
:mod:`shmbuf.core.plain`."""
