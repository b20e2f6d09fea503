"""Drop-in APIs of the reference replay buffers, backed by shmbuf's shared memory.

One module per library, each thin: it maps the library's calls onto
:class:`shmbuf.Buffer` / :class:`shmbuf.EpisodeBuffer` and keeps the library's names,
signatures, defaults, return types and exceptions; every facade object lives in a
named segment, can be attached from another process (``<Class>.attach(name)``) and
pickles as its name. Where a library has a bug, the facade does what the README's
divergence table says instead.

* :mod:`shmbuf.compat.imitation`: ``Buffer``, ``ReplayBuffer``, ``Transitions``
* :mod:`shmbuf.compat.fishyrl`: ``SequentialBuffer``, ``convert_samples_to_tensors``
* :mod:`shmbuf.compat.velora`: ``ReplayBuffer``, ``BatchExperience`` (needs torch)
"""
