"""``holoflow.nn.utils.rnn``: packed and padded variable-length sequences, as ``torch.nn.utils.rnn``.

A :class:`PackedSequence` holds the time-major rows of a batch sorted by decreasing length:
``data[offset_t : offset_t + batch_sizes[t]]`` are the sequences still running at step ``t``.
Packing and unpacking are slices and concatenations of holoflow tensors, so gradients flow
through them; ``batch_sizes`` and the permutations are int64 tensors, as in torch.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any, Sequence

import torch

from ...core.tensor import Tensor
from ...ops.creation import full, tensor
from ...ops.shape import cat, stack
from ...ops.sorting import argsort

__all__ = ["PackedSequence", "batch_sizes_of", "pack_padded_sequence", "pad_packed_sequence", "pad_sequence",
           "pack_sequence", "unpad_sequence", "unpack_sequence", "invert_permutation"]


class PackedSequence(namedtuple("PackedSequence", ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])):
    """``(data, batch_sizes, sorted_indices, unsorted_indices)``; build it with
    :func:`pack_padded_sequence` or :func:`pack_sequence`, not directly."""

    def __new__(cls, data: Tensor, batch_sizes: Tensor | None = None, sorted_indices: Tensor | None = None,
                unsorted_indices: Tensor | None = None) -> "PackedSequence":
        if unsorted_indices is None and sorted_indices is not None:
            unsorted_indices = invert_permutation(sorted_indices)
        if batch_sizes is None:
            raise ValueError("holoflow.nn.utils.rnn.PackedSequence: batch_sizes is required (use "
                             "pack_padded_sequence or pack_sequence to build one)")
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def with_data(self, data: Tensor) -> "PackedSequence":
        """The same packing around new ``data`` rows."""
        out = type(self)(data, self.batch_sizes, self.sorted_indices, self.unsorted_indices)
        out._sizes = getattr(self, "_sizes", None)
        return out

    def to(self, *args: Any, **kwargs: Any) -> "PackedSequence":
        data = self.data.to(*args, **kwargs)
        return self if data is self.data else self.with_data(data)

    def _cast(self, name: str) -> "PackedSequence":
        return self.with_data(getattr(self.data, name)())

    def float(self) -> "PackedSequence":
        return self._cast("float")

    def double(self) -> "PackedSequence":
        return self._cast("double")

    def half(self) -> "PackedSequence":
        return self._cast("half")

    def cpu(self) -> "PackedSequence":
        return self.to("cpu")

    def cuda(self, *args: Any, **kwargs: Any) -> "PackedSequence":
        return self.to("cuda")

    @property
    def is_cuda(self) -> bool:
        return self.data.device.type == "cuda"

    def is_pinned(self) -> bool:
        return False


def batch_sizes_of(sequence: PackedSequence) -> list[int]:
    """The batch sizes as Python ints: kept from packing (so graph tracing, where the tensor's
    values are not known, still has them), else read from the tensor."""
    sizes = getattr(sequence, "_sizes", None)
    return list(sizes) if sizes is not None else [int(v) for v in sequence.batch_sizes.tolist()]


def invert_permutation(permutation: Tensor | None) -> Tensor | None:
    """The inverse of an index permutation (``None`` stays ``None``)."""
    if permutation is None:
        return None
    return argsort(permutation)


def _lengths_list(name: str, lengths: Any) -> list[int]:
    if isinstance(lengths, Tensor):
        if lengths.is_floating_point() or lengths.dim() != 1:
            raise ValueError(f"holoflow.nn.utils.rnn.{name}: lengths must be a 1-D integer tensor or a list of "
                             f"ints, got a tensor of shape {tuple(lengths.shape)} and dtype {lengths.dtype}")
        return [int(v) for v in lengths.tolist()]
    if isinstance(lengths, torch.Tensor):
        return [int(v) for v in lengths.tolist()]
    return [int(v) for v in lengths]


def pack_padded_sequence(input: Tensor, lengths: Any, batch_first: bool = False,
                         enforce_sorted: bool = True) -> PackedSequence:
    """Packs a padded ``(T, B, *)`` (``(B, T, *)`` with ``batch_first``) batch of sequences of
    the given ``lengths``; with ``enforce_sorted=False`` the batch is sorted here (descending)."""
    lens = _lengths_list("pack_padded_sequence", lengths)
    bdim = 0 if batch_first else 1
    if input.dim() < 2 or len(lens) != input.shape[bdim]:
        raise ValueError(f"holoflow.nn.utils.rnn.pack_padded_sequence: {len(lens)} lengths for an input of "
                         f"shape {tuple(input.shape)} whose batch dim ({bdim}) has "
                         f"{input.shape[bdim] if input.dim() > bdim else 0} entries")
    if enforce_sorted:
        if any(a < b for a, b in zip(lens, lens[1:])):
            raise RuntimeError("holoflow.nn.utils.rnn.pack_padded_sequence: `lengths` array must be sorted in "
                               f"decreasing order when `enforce_sorted` is True (got {lens}). You can pass "
                               "`enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to sidestep "
                               "this requirement if you do not need ONNX exportability.")
        sorted_indices = None
    else:
        # host-side metadata, sorted by torch's own call so ties order as in torch (and graph
        # tracing, where tensors have no values, still knows the permutation)
        lt, order = torch.sort(torch.as_tensor(lens, dtype=torch.int64), descending=True)
        lens = [int(v) for v in lt.tolist()]
        sorted_indices = tensor(order.tolist(), dtype=torch.int64)
        input = input.index_select(bdim, sorted_indices)
    if lens and lens[-1] <= 0:
        raise RuntimeError("holoflow.nn.utils.rnn.pack_padded_sequence: Length of all samples has to be greater "
                           f"than 0, but found an element in 'lengths' that is <= 0 (lengths {lens})")
    if lens and lens[0] > input.shape[1 - bdim]:
        raise ValueError(f"holoflow.nn.utils.rnn.pack_padded_sequence: a length of {lens[0]} exceeds the "
                         f"{input.shape[1 - bdim]} time steps of the input of shape {tuple(input.shape)}")
    if batch_first:
        input = input.transpose(0, 1)
    steps = lens[0] if lens else 0
    batch_sizes = [sum(1 for n in lens if n > t) for t in range(steps)]
    data = cat([input[t].narrow(0, 0, bs) for t, bs in enumerate(batch_sizes)], 0)
    out = PackedSequence(data, tensor(batch_sizes, dtype=torch.int64), sorted_indices,
                         invert_permutation(sorted_indices))
    out._sizes = batch_sizes
    return out


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None) -> tuple[Tensor, Tensor]:
    """The inverse of :func:`pack_padded_sequence`: ``(padded, lengths)``, in the original batch
    order; ``total_length`` pads the time axis further."""
    data, _, _, unsorted = sequence
    bs = batch_sizes_of(sequence)
    steps = len(bs)
    if total_length is not None:
        if total_length < steps:
            raise ValueError(f"holoflow.nn.utils.rnn.pad_packed_sequence: Expected total_length to be at least the "
                             f"length of the longest sequence in input, but got total_length={total_length} and "
                             f"max sequence length being {steps}")
    else:
        total_length = steps
    b = bs[0] if bs else 0
    rest = tuple(data.shape[1:])
    rows, off = [], 0
    for n in bs:
        chunk = data.narrow(0, off, n)
        off += n
        if n < b:
            chunk = cat([chunk, full((b - n,) + rest, padding_value, dtype=data.dtype, device=data.device)], 0)
        rows.append(chunk)
    if total_length > steps or not rows:
        rows += [full((b,) + rest, padding_value, dtype=data.dtype, device=data.device)] * (total_length - steps)
    padded = stack(rows, 0) if rows else full((0, b) + rest, padding_value, dtype=data.dtype, device=data.device)
    lengths = tensor([sum(1 for n in bs if n > i) for i in range(b)], dtype=torch.int64)
    if unsorted is not None:
        padded = padded.index_select(1, unsorted)
        lengths = lengths.index_select(0, unsorted)
    return (padded.transpose(0, 1) if batch_first else padded), lengths


def pad_sequence(sequences: Sequence[Tensor], batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Stacks ``(L_i, *)`` sequences into ``(T, B, *)`` (``(B, T, *)``), padding each to the
    longest with ``padding_value`` on ``padding_side``."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"holoflow.nn.utils.rnn.pad_sequence: padding_side must be 'left' or 'right', got "
                         f"{padding_side!r}")
    if isinstance(sequences, Tensor):
        sequences = list(sequences.unbind(0))
    if not sequences:
        raise RuntimeError("holoflow.nn.utils.rnn.pad_sequence: received an empty list of sequences")
    rest = tuple(sequences[0].shape[1:])
    for i, s in enumerate(sequences):
        if tuple(s.shape[1:]) != rest:
            raise RuntimeError(f"holoflow.nn.utils.rnn.pad_sequence: sequence {i} has shape {tuple(s.shape)}; "
                               f"every sequence needs trailing dims {rest}")
    longest = max(s.shape[0] for s in sequences)
    out = []
    for s in sequences:
        n = longest - s.shape[0]
        if n:
            p = full((n,) + rest, padding_value, dtype=s.dtype, device=s.device)
            s = cat([s, p] if padding_side == "right" else [p, s], 0)
        out.append(s)
    return stack(out, 0 if batch_first else 1)


def pack_sequence(sequences: Sequence[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """Packs a list of ``(L_i, *)`` sequences (pad, then pack)."""
    lengths = [s.shape[0] for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpad_sequence(padded_sequences: Tensor, lengths: Any, batch_first: bool = False) -> list[Tensor]:
    """The list of unpadded sequences of a padded batch."""
    if not batch_first:
        padded_sequences = padded_sequences.transpose(0, 1)
    return [padded_sequences[i].narrow(0, 0, n) for i, n in enumerate(_lengths_list("unpad_sequence", lengths))]


def unpack_sequence(packed_sequences: PackedSequence) -> list[Tensor]:
    """The list of sequences of a :class:`PackedSequence`, in the original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
