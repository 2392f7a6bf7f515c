"""A pipeline stage whose receive buffers hold memory only while their microbatch is in flight.

torch's :class:`~torch.distributed.pipelining.PipelineStage` allocates, at its first step, one
activation receive buffer per microbatch for a stage that is not the first and one gradient
receive buffer per microbatch for a stage that is not the last, and keeps them all (and the
gradients autograd accumulates into the activation buffers) until the next step. That is
``m`` streams of (B, N / (cp x tp_sp), D) per stage boundary for the whole step: for dit-28b at
74k tokens, TP8 SP CP4 PP4 with 4 virtual stages and the paper's 256 microbatches, ~10 streams
of 27 MiB per microbatch on pipeline rank 0 — about 68 GiB on an 80 GB GPU, beyond every
activation of the step. Megatron receives into a tensor allocated for that one transfer.

:class:`LeanStage` keeps torch's schedules and communication and changes only the buffers'
lifetime: a microbatch's buffers are allocated when its receive is posted and dropped after its
backward (a buffer the schedule still sends from lives on through that send's reference), so a
stage holds them for the microbatches in flight — what the planner's activation model counts.
"""

from __future__ import annotations

import copy

import torch
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.stage import _RecvInfo


def _idle(info: _RecvInfo, device: torch.device) -> _RecvInfo:
    """A copy of ``info`` holding an empty buffer (root inputs and absent gradients, which have
    none, unchanged)."""
    info = copy.copy(info)
    _release((info,), device)
    return info


def _allocate(infos: tuple[_RecvInfo, ...], device: torch.device) -> None:
    for info in infos:
        if not info.is_root_arg and info.buffer is not None and info.tensor_meta is not None:
            meta = info.tensor_meta  # shape, stride, dtype: the buffer's exact layout
            info.buffer = torch.empty_strided(
                meta.shape, meta.stride, dtype=meta.dtype, device=device
            )


def _release(infos: tuple[_RecvInfo, ...], device: torch.device) -> None:
    for info in infos:
        if not info.is_root_arg and info.buffer is not None:
            info.buffer = torch.empty(0, dtype=info.buffer.dtype, device=device)


class LeanStage(PipelineStage):
    """:class:`~torch.distributed.pipelining.PipelineStage` with per-microbatch receive buffers
    that exist from their receive to their microbatch's backward (module docstring)."""

    def _setup_forward_recv_info(self, num_microbatches: int, has_backward: bool) -> None:
        super()._setup_forward_recv_info(1, has_backward)  # one microbatch's, as the template
        template = self.args_recv_info[0]
        for chunk in range(num_microbatches):
            self.args_recv_info[chunk] = tuple(_idle(info, self.device) for info in template)

    def _create_grad_recv_info(self, act_send_info: dict) -> tuple[_RecvInfo, ...]:
        infos = super()._create_grad_recv_info(act_send_info)  # fresh per microbatch
        _release(infos, self.device)
        return infos

    def get_fwd_recv_ops(self, fwd_chunk_id: int):
        _allocate(self.args_recv_info[fwd_chunk_id], self.device)
        return super().get_fwd_recv_ops(fwd_chunk_id)

    def get_bwd_recv_ops(self, bwd_chunk_id: int):
        _allocate(self.grad_recv_info[bwd_chunk_id], self.device)
        return super().get_bwd_recv_ops(bwd_chunk_id)

    def backward_one_chunk(
        self, bwd_chunk_id: int, loss=None, full_backward: bool = True, last_backward=False
    ):
        out = super().backward_one_chunk(
            bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward
        )
        if full_backward:  # a split backward still needs its inputs for the weight gradients
            _release(self.args_recv_info.get(bwd_chunk_id, ()), self.device)
            _release(self.grad_recv_info.get(bwd_chunk_id, ()), self.device)
        return out
