"""holoflow.distributed: the global view (placement, SBP, boxing) and its communication layer.

Communication layer (this package's comm side): :mod:`.env` (ranks, lazy process-group set-up),
:mod:`.process_group` (torch.distributed's API: ``init_process_group``, ``all_reduce``, ...),
:mod:`.groups` (process groups named by global ranks), :mod:`.comm` (collectives on torch
tensors, what boxing calls), :mod:`.comm_api` (``holoflow.comm``, on holoflow Tensors),
:mod:`.launch` (``python -m holoflow.distributed.launch``), :mod:`.ddp` (gradient bucketing).
"""
from . import env, groups, comm, comm_api, process_group
from .comm_track import CommError, count
from .ddp import GradBucket
from .env import get_local_rank, get_local_world_size, get_node_size, is_multi_process, set_comm_timeout
# torch.distributed's process-group API on holoflow Tensors (``import torch.distributed`` under mock_torch)
from .process_group import *  # noqa: F403

# ---- global view (placement / SBP / global tensors / boxing / dispatch): the lead adds imports here ----
# ---- end of global view imports ----
