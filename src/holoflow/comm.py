"""``holoflow.comm``: collectives on local tensors (see :mod:`holoflow.distributed.comm_api`)."""
from .distributed.comm_api import *  # noqa: F401,F403
from .distributed.comm_api import __all__  # noqa: F401
