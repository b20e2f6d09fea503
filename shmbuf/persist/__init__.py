"""What outlives a process: saves to a directory (:mod:`~shmbuf.persist.save`, their files
in :mod:`~shmbuf.persist.savedir`) and a buffer's contents as a state dict
(:mod:`~shmbuf.persist.state`)."""
