"""``holoflow.env``: rank and world queries, process-group set-up (see :mod:`holoflow.distributed.env`)."""
from .distributed.env import *  # noqa: F401,F403
from .distributed.env import __all__  # noqa: F401
