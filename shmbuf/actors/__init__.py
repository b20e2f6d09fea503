"""Actor processes (:mod:`~shmbuf.actors.processes`) and the versioned policy weights they
read (:mod:`~shmbuf.actors.weights`)."""

from shmbuf.actors.processes import LEARNER_GRACE, Actor, Actors, example_actor
from shmbuf.actors.weights import Weights

__all__ = ["Actor", "Actors", "LEARNER_GRACE", "Weights", "example_actor"]
