"""Policy versions (``Buffer.create(..., versions=True)``): every row keeps the version of
the policy that wrote it, and samples can ask for recent ones. :mod:`~shmbuf.versions.bound`
holds what ``create`` adds and the handle's versions (``version=``, ``bind``),
:mod:`~shmbuf.versions.recent` the sampler of rows whose version is at least a bound
(``min_version=``, ``max_staleness=``)."""
