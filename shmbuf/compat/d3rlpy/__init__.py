"""d3rlpy's replay buffers over shared memory: switch with one import
(``from shmbuf.compat.d3rlpy import ReplayBuffer``). The facade is :mod:`~shmbuf.compat.d3rlpy.replay`;
its halves and d3rlpy's other parts have a file each."""

from shmbuf.compat.d3rlpy.replay import (ActionSpace, BasicTrajectorySlicer, BasicTransitionPicker, DatasetInfo, Episode, EpisodeGenerator, FIFOBuffer, FrameStackTrajectorySlicer, FrameStackTransitionPicker, InfiniteBuffer, MixedReplayBuffer, MultiStepTransitionPicker, PartialTrajectory, ReplayBuffer, Signature, SparseRewardTransitionPicker, TrajectoryMiniBatch, Transition, TransitionMiniBatch, VERSION, create_fifo_replay_buffer, create_infinite_replay_buffer, dump, load)

__all__ = ["ActionSpace", "BasicTrajectorySlicer", "BasicTransitionPicker", "DatasetInfo", "Episode", "EpisodeGenerator", "FIFOBuffer", "FrameStackTrajectorySlicer", "FrameStackTransitionPicker", "InfiniteBuffer", "MixedReplayBuffer", "MultiStepTransitionPicker", "PartialTrajectory", "ReplayBuffer", "Signature", "SparseRewardTransitionPicker", "TrajectoryMiniBatch", "Transition", "TransitionMiniBatch", "VERSION", "create_fifo_replay_buffer", "create_infinite_replay_buffer", "dump", "load"]
