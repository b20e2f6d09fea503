"""Prioritized replay (``Buffer.create(..., priority=alpha)``): the shared sum and min
trees (:mod:`~shmbuf.priority.trees`), the checks of priority values
(:mod:`~shmbuf.priority.values`) and the sampler that draws by the trees
(:mod:`~shmbuf.priority.prioritized`)."""
