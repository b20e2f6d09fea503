"""Drop-in APIs of the reference replay buffers, backed by shmbuf's shared memory.

One module per library, each thin: it maps the library's calls onto
:class:`shmbuf.Buffer` / :class:`shmbuf.EpisodeBuffer` and keeps the library's names,
signatures, defaults, return types and exceptions; every facade object lives in a
named segment, can be attached from another process (``<Class>.attach(name)``) and
pickles as its name. Each module says at its top which upstream version it behaves as;
the migration pages of the docs (docs/migrate/) list what still differs, and why.

* :mod:`shmbuf.compat.imitation`: ``Buffer``, ``ReplayBuffer``, ``Transitions``
* :mod:`shmbuf.compat.fishyrl`: ``Buffer``, ``SequentialBuffer``, ``IndependentVectorizedBuffer``,
  ``convert_samples_to_tensors``
* :mod:`shmbuf.compat.velora`: ``ReplayBuffer``, ``BatchExperience`` (needs torch)
* :mod:`shmbuf.compat.garage`: ``PathBuffer``, ``HERReplayBuffer``, ``ReplayBuffer``
* :mod:`shmbuf.compat.d3rlpy`: ``ReplayBuffer``, ``FIFOBuffer``, ``InfiniteBuffer``, the
  transition pickers and trajectory slicers, ``Episode``, ``Signature``, ``ActionSpace``,
  ``EpisodeGenerator``, ``MixedReplayBuffer``, ``dump``, ``load`` (d3rlpy's own types where
  it is installed)
"""
