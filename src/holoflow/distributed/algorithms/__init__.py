"""torch's ``torch.distributed.algorithms``: the DDP communication hooks (``ddp_comm_hooks``)."""
