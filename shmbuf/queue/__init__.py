"""The queue (``Buffer.create(..., mode="queue")``): rows consumed in order, each
delivered to exactly one ``take``. :mod:`~shmbuf.queue.protocol` holds the write part
(:class:`~shmbuf.queue.protocol.Queue`: room, takes, give-backs), :mod:`~shmbuf.queue.takes`
which rows a take gets, :mod:`~shmbuf.queue.restart` a queue in a buffer file across a
restart of the machine, :mod:`~shmbuf.queue.take` what ``create`` adds and
``Buffer.take``, :mod:`~shmbuf.queue.consumed` its sampler (which refuses samples)."""
