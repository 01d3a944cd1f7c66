"""``holoflow.dtensor.fsdp``: torch's ``torch.distributed.fsdp`` (what mock_torch gives for it) on
holoflow's global tensors: FSDP2's ``fully_shard`` (``_fully_shard``), FSDP1's
``FullyShardedDataParallel`` wrapper (``fully_sharded_data_parallel``) with its configuration
types (``api``), and the auto-wrap policies (``wrap``)."""
from ._fully_shard import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, UnshardHandle,
                           fully_shard, register_fsdp_forward_method)
from .api import (BackwardPrefetch, CPUOffload, FullOptimStateDictConfig, FullStateDictConfig,
                  LocalOptimStateDictConfig, LocalStateDictConfig, MixedPrecision, OptimStateDictConfig,
                  OptimStateKeyType, ShardedOptimStateDictConfig, ShardedStateDictConfig, ShardingStrategy,
                  StateDictConfig, StateDictSettings, StateDictType)
from .fully_sharded_data_parallel import FullyShardedDataParallel
from .sharded_grad_scaler import ShardedGradScaler

__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy", "UnshardHandle",
           "register_fsdp_forward_method", "FullyShardedDataParallel", "ShardingStrategy", "BackwardPrefetch",
           "MixedPrecision", "CPUOffload", "StateDictType", "StateDictConfig", "FullStateDictConfig",
           "LocalStateDictConfig", "ShardedStateDictConfig", "OptimStateDictConfig", "FullOptimStateDictConfig",
           "LocalOptimStateDictConfig", "ShardedOptimStateDictConfig", "StateDictSettings", "OptimStateKeyType",
           "ShardedGradScaler"]
