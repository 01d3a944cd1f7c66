"""``holoflow.distributed_pipelining``: torch's ``torch.distributed.pipelining`` (what mock_torch
gives for it) for eager programs of local tensors: each rank wraps its own part of the model in
a :class:`PipelineStage` and a schedule (:class:`ScheduleGPipe`, :class:`Schedule1F1B`; for
several stages per rank :class:`ScheduleLoopedBFS` or :class:`ScheduleInterleaved1F1B`) splits
each batch into micro-batches, sends activations forward and their gradients back between the
stages' ranks, and leaves each stage's parameter gradients accumulated (averaged over the
micro-batches, as torch's ``scale_grads``). ``nn.Graph`` has its own pipelines
(``config.set_pipeline_stages``)."""
from .schedules import (PipelineScheduleMulti, PipelineScheduleSingle, Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                        ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, ScheduleLoopedBFS,
                        ScheduleZBVZeroBubble)
from .stage import PipelineStage, SplitPoint, pipeline

__all__ = ["PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleLoopedBFS", "ScheduleInterleaved1F1B",
           "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV",
           "PipelineScheduleSingle", "PipelineScheduleMulti", "SplitPoint", "pipeline"]
