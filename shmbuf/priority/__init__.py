"""Prioritized replay: the shared sum and min trees (:mod:`~shmbuf.priority.trees`) and
the sampler that draws by them (:mod:`~shmbuf.samplers.prioritized`)."""
