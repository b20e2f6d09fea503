"""Helpers of the test suite, by subject; child-process code lives in these modules.

Everything is re-exported here, so ``import helpers`` / ``from helpers import x`` work.
"""

from .processes import *  # noqa: F401,F403
from .storm import *  # noqa: F401,F403
from .episodes import *  # noqa: F401,F403
from .goals import *  # noqa: F401,F403
from .priority import *  # noqa: F401,F403
from .persist import *  # noqa: F401,F403
from .weights import *  # noqa: F401,F403
from .tensors import *  # noqa: F401,F403
from .compat import *  # noqa: F401,F403
from .queues import *  # noqa: F401,F403
from .ragged import *  # noqa: F401,F403
from .limited import *  # noqa: F401,F403
from .versions import *  # noqa: F401,F403
from .prio_storm import *  # noqa: F401,F403
from .frames import *  # noqa: F401,F403
from .user_sampler import *  # noqa: F401,F403
