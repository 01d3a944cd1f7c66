"""``holoflow.distributed_pipelining``: torch's ``torch.distributed.pipelining`` (what mock_torch
gives for it) for eager programs of local tensors: each rank wraps its own part of the model in
a :class:`PipelineStage` (by hand, or from :func:`pipeline`, which traces the model and splits it
at ``SplitPoint``s and ``pipe_split()`` marks) and a schedule (:class:`ScheduleGPipe`,
:class:`Schedule1F1B`; for several stages per rank :class:`ScheduleLoopedBFS`,
:class:`ScheduleInterleaved1F1B` or the zero-bubble :class:`ScheduleInterleavedZeroBubble`,
:class:`ScheduleZBVZeroBubble`, :class:`ScheduleDualPipeV`) splits
each batch into micro-batches, sends activations forward and their gradients back between the
stages' ranks, and leaves each stage's parameter gradients accumulated (averaged over the
micro-batches, as torch's ``scale_grads``). ``nn.Graph`` has its own pipelines
(``config.set_pipeline_stages``)."""
from .schedules import (PipelineScheduleMulti, PipelineScheduleSingle, Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                        ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, ScheduleLoopedBFS,
                        ScheduleZBVZeroBubble)
from .stage import PipelineStage, SplitPoint
from ._pipe import Pipe, PipeInfo, build_stage, pipe_split, pipeline   # (after .stage, which it imports)

__all__ = ["PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleLoopedBFS", "ScheduleInterleaved1F1B",
           "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV",
           "PipelineScheduleSingle", "PipelineScheduleMulti", "SplitPoint", "pipeline", "Pipe", "PipeInfo",
           "pipe_split", "build_stage"]
