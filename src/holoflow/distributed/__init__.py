"""holoflow.distributed: the global view (placement, SBP, boxing) and its communication layer.

Communication layer (this package's comm side): :mod:`.env` (ranks, lazy process-group set-up),
:mod:`.groups` (process groups named by global ranks), :mod:`.comm` (collectives on torch
tensors, what boxing calls), :mod:`.comm_api` (``holoflow.comm``, on holoflow Tensors),
:mod:`.launch` (``python -m holoflow.distributed.launch``), :mod:`.ddp` (gradient bucketing).
"""
from . import env, groups, comm, comm_api
from .comm_track import CommError, count
from .env import (get_local_rank, get_local_world_size, get_node_size, get_rank, get_world_size,
                  is_multi_process, set_comm_timeout)

# ---- global view (placement / SBP / global tensors / boxing / dispatch): the lead adds imports here ----
# ---- end of global view imports ----
