"""The configuration types of FSDP1 (``torch.distributed.fsdp.api``): sharding strategies, mixed
precision, CPU offload and the state-dict settings, with torch's names, fields and defaults."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import NamedTuple

from ...core.dtype import dtype as DType
from ...nn.modules.norm import _BatchNorm

__all__ = ["ShardingStrategy", "BackwardPrefetch", "MixedPrecision", "CPUOffload", "StateDictType",
           "StateDictConfig", "FullStateDictConfig", "LocalStateDictConfig", "ShardedStateDictConfig",
           "OptimStateDictConfig", "FullOptimStateDictConfig", "LocalOptimStateDictConfig",
           "ShardedOptimStateDictConfig", "StateDictSettings", "OptimStateKeyType"]


class ShardingStrategy(Enum):
    """FULL_SHARD: parameters, gradients and optimizer state sharded, the parameters gathered for
    each forward and again for backward (ZeRO-3); SHARD_GRAD_OP: kept gathered from forward to
    backward (ZeRO-2); NO_SHARD: replicated (data parallel); HYBRID_SHARD: FULL_SHARD within a
    node, replicated across nodes; _HYBRID_SHARD_ZERO2: SHARD_GRAD_OP within a node."""

    FULL_SHARD = auto()
    SHARD_GRAD_OP = auto()
    NO_SHARD = auto()
    HYBRID_SHARD = auto()
    _HYBRID_SHARD_ZERO2 = auto()


class BackwardPrefetch(Enum):
    BACKWARD_PRE = auto()
    BACKWARD_POST = auto()


class StateDictType(Enum):
    """What ``state_dict()`` of an FSDP1 model returns: whole tensors (FULL), DTensors (SHARDED)
    or each rank's own pieces (LOCAL)."""

    FULL_STATE_DICT = auto()
    LOCAL_STATE_DICT = auto()
    SHARDED_STATE_DICT = auto()


class OptimStateKeyType(Enum):
    PARAM_NAME = auto()
    PARAM_ID = auto()


@dataclass
class MixedPrecision:
    """``param_dtype``: the gathered parameters' dtype in forward and backward (the shards and the
    optimizer stay in theirs); ``buffer_dtype``: the buffers' dtype; ``cast_root_forward_inputs``
    / ``cast_forward_inputs``: floating inputs of the root / of every wrapped module cast to
    ``param_dtype``; ``reduce_dtype``: the dtype gradients are summed in across ranks
    (``param_dtype`` if None, as torch's); they land in the shards' dtype."""

    param_dtype: DType | None = None
    reduce_dtype: DType | None = None
    buffer_dtype: DType | None = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True
    _module_classes_to_ignore: tuple = (_BatchNorm,)


@dataclass
class CPUOffload:
    offload_params: bool = False


@dataclass
class StateDictConfig:
    offload_to_cpu: bool = False


@dataclass
class FullStateDictConfig(StateDictConfig):
    """``rank0_only``: only rank 0 gets the entries (the others an empty dict)."""

    rank0_only: bool = False


@dataclass
class LocalStateDictConfig(StateDictConfig):
    pass


@dataclass
class ShardedStateDictConfig(StateDictConfig):
    _use_dtensor: bool = False


@dataclass
class OptimStateDictConfig:
    offload_to_cpu: bool = True


@dataclass
class FullOptimStateDictConfig(OptimStateDictConfig):
    rank0_only: bool = False


@dataclass
class LocalOptimStateDictConfig(OptimStateDictConfig):
    offload_to_cpu: bool = False


@dataclass
class ShardedOptimStateDictConfig(OptimStateDictConfig):
    _use_dtensor: bool = False


class StateDictSettings(NamedTuple):
    state_dict_type: StateDictType
    state_dict_config: StateDictConfig
    optim_state_dict_config: OptimStateDictConfig
