"""Beyond one machine: one shmbuf per node of a Ray cluster, sampled as one buffer.

``ShardedBuffer.create`` puts a shard (a shmbuf segment, ``persist=True``) on each node,
owned by a Ray actor pinned there. Writers on a node attach their node's shard by name
(:meth:`ShardedBuffer.local`) and write into shared memory as on one machine: Ray is
not in their path. A learner anywhere samples: per-shard counts drawn on the shards'
sizes (or priority masses), sub-batches fetched in parallel through Ray's object store,
dead or silent shards dropped (and back when they answer). Ray is imported when a
``ShardedBuffer`` is made or used, never by ``import shmbuf``; install it with
``pip install '.[ray]'`` from a clone (shmbuf is not on the package index).
"""

from shmbuf.ray.sharded import NAMESPACE, ShardedBuffer, ShardsUnavailable, ShardWarning

__all__ = ["NAMESPACE", "ShardedBuffer", "ShardsUnavailable", "ShardWarning"]
