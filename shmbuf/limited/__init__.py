"""Rows sampled at most ``k`` times (``Buffer.create(..., max_times_sampled=k)``).
:mod:`~shmbuf.limited.counted` holds the write part (each row written with its count of
samples at 0, :data:`~shmbuf.limited.counted.TIMES`), :mod:`~shmbuf.limited.sampler` what
``create`` adds and the sampler that counts each row it returns."""
