"""Saves of a live buffer to a directory and their loads (:mod:`~shmbuf.persist.save`),
and the files a save is made of (:mod:`~shmbuf.persist.savedir`). A buffer's contents as
a state dict are the core's (:mod:`shmbuf.core.contents`)."""
