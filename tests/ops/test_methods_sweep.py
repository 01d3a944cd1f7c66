"""Tensor methods, properties and Python protocols against torch, and torch's NumPy argument names
(``axis=`` for ``dim=``, ``keepdims=`` for ``keepdim=``, taken by every function and method that
has those parameters). Found: NumPy's names were refused; ``x.norm(p="nuc", dim=...)`` was
refused; ``5.0 in x`` raised (no ``__contains__``). (``x.type()`` names holoflow's types, as
OneFlow's names oneflow's.)"""
from __future__ import annotations

import pytest
import torch

import holoflow as flow
from harness import same_as_torch, sweep

X = torch.arange(24.0).reshape(2, 3, 4)
IMG = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))


def _img(m):
    return flow.from_torch(IMG) if m is flow else IMG


# (m: torch or holoflow, a: X as a tensor of that library)
METHODS = [
    ("sum axis", lambda m, a: m.sum(a, axis=1)),
    ("sum axis keepdims", lambda m, a: m.sum(a, axis=(0, 2), keepdims=True)),
    ("mean axis", lambda m, a: a.mean(axis=-1)),
    ("max axis", lambda m, a: m.max(a, axis=1)),
    ("cat axis", lambda m, a: m.cat([a, a], axis=2)),
    ("stack axis", lambda m, a: m.stack([a, a], axis=0)),
    ("argmax axis", lambda m, a: a.argmax(axis=2)),
    ("std axis", lambda m, a: a.std(axis=0)),
    ("prod dim kw", lambda m, a: a.prod(dim=1, keepdim=True)),
    ("amax axis", lambda m, a: a.amax(axis=(1, 2))),
    ("any axis", lambda m, a: (a > 5).any(axis=1)),
    ("flip dims kw", lambda m, a: a.flip(dims=[0])),
    ("squeeze axis", lambda m, a: a[:, :1].squeeze(axis=1)),
    ("unsqueeze dim", lambda m, a: a.unsqueeze(dim=0)),
    ("transpose kw", lambda m, a: a.transpose(dim0=0, dim1=2)),
    ("swapaxes", lambda m, a: a.swapaxes(0, 1)),
    ("moveaxis", lambda m, a: a.moveaxis(0, -1)),
    ("T", lambda m, a: a[0].T),
    ("mT", lambda m, a: a.mT),
    ("H", lambda m, a: a[0].H),
    ("mH", lambda m, a: a.mH),
    ("size -1", lambda m, a: a.size(-1)),
    ("size dim kw", lambda m, a: a.size(dim=1)),
    ("shape", lambda m, a: tuple(a.shape)),
    ("stride", lambda m, a: a.stride()),
    ("stride dim", lambda m, a: a.stride(1)),
    ("transposed stride", lambda m, a: a.transpose(0, 2).stride()),
    ("storage_offset", lambda m, a: a[1, 1:].storage_offset()),
    ("element_size", lambda m, a: a.element_size()),
    ("nbytes", lambda m, a: a.nbytes),
    ("itemsize", lambda m, a: a.itemsize),
    ("dim_order", lambda m, a: a.permute(2, 0, 1).dim_order()),
    ("is_contiguous", lambda m, a: a.transpose(0, 1).is_contiguous()),
    ("ndim", lambda m, a: a.ndim),
    ("numel", lambda m, a: a.numel()),
    ("nelement", lambda m, a: a.nelement()),
    ("type dtype", lambda m, a: a.type(m.float64)),
    ("type str arg", lambda m, a: a.type("torch.DoubleTensor")),
    ("to other", lambda m, a: a.to(m.ones(2, dtype=m.int32))),
    ("to device dtype", lambda m, a: a.to("cpu", m.float16)),
    ("to copy", lambda m, a: a.to(dtype=m.float64, copy=True)),
    ("half", lambda m, a: a.half()),
    ("bool", lambda m, a: a.bool()),
    ("long", lambda m, a: a.long()),
    ("int", lambda m, a: (a * 0.5).int()),
    ("byte", lambda m, a: a.byte()),
    ("char", lambda m, a: a.char()),
    ("short", lambda m, a: a.short()),
    ("bfloat16", lambda m, a: a.bfloat16()),
    ("cdouble", lambda m, a: a.cdouble()),
    ("item", lambda m, a: a[1, 2, 3].item()),
    ("tolist", lambda m, a: a[0].tolist()),
    ("tolist scalar", lambda m, a: a[0, 0, 0].tolist()),
    ("new_tensor", lambda m, a: a.new_tensor([1, 2])),
    ("new_zeros", lambda m, a: a.new_zeros((2, 2), dtype=m.int64)),
    ("new_full", lambda m, a: a.new_full((2,), 7)),
    ("new_ones size args", lambda m, a: a.new_ones(2, 3)),
    ("new_empty shape", lambda m, a: tuple(a.new_empty(3, 2).shape)),
    ("expand_as", lambda m, a: a[:, :1].expand_as(a)),
    ("view_as", lambda m, a: a.view_as(a.reshape(4, 6))),
    ("reshape_as", lambda m, a: a.reshape_as(a.reshape(6, 4))),
    ("type_as", lambda m, a: a.type_as(m.ones(1, dtype=m.int64))),
    ("repeat", lambda m, a: a.repeat(2, 1, 1, 1)),
    ("tile", lambda m, a: a.tile((2,))),
    ("unfold method", lambda m, a: a.unfold(2, 2, 1)),
    ("view -1", lambda m, a: a.view(-1, 4)),
    ("view dtype", lambda m, a: a.view(m.int32)),
    ("contiguous cl stride", lambda m, a: _img(m).contiguous(memory_format=m.channels_last).stride()),
    ("is_contiguous cl", lambda m, a: _img(m).contiguous(memory_format=m.channels_last).is_contiguous(memory_format=m.channels_last)),
    ("to cl stride", lambda m, a: _img(m).to(memory_format=m.channels_last).stride()),
    ("empty_like cl keeps", lambda m, a: m.empty_like(_img(m).contiguous(memory_format=m.channels_last)).stride()),
    ("clone keeps stride", lambda m, a: a.transpose(0, 2).clone().stride()),
    ("clone contiguous", lambda m, a: a.transpose(0, 2).clone(memory_format=m.contiguous_format).stride()),
    ("add out-of-place strides", lambda m, a: (a.transpose(0, 2) + 1).stride()),
    ("zeros_like strides", lambda m, a: m.zeros_like(a.transpose(0, 2)).stride()),
    ("masked_fill", lambda m, a: a.masked_fill(a > 10, float("-inf"))),
    ("index_fill", lambda m, a: a.index_fill(1, m.tensor([0, 2]), -1.0)),
    ("fill_ scalar tensor", lambda m, a: a.clone().fill_(m.tensor(3.0))),
    ("clamp_ kw", lambda m, a: a.clone().clamp_(min=3)),
    ("map_", lambda m, a: a.clone().map_(a, lambda u, v: u + v)),
    ("allclose", lambda m, a: m.allclose(a, a + 1e-9)),
    ("equal", lambda m, a: m.equal(a, a.clone())),
    ("isclose", lambda m, a: m.isclose(a, a + 0.1, atol=0.2)),
    ("dist", lambda m, a: a.dist(a + 1, 3)),
    ("norm p dim", lambda m, a: a.norm(p=1, dim=1)),
    ("norm fro", lambda m, a: a.norm(p="fro", dim=(1, 2))),
    ("norm nuc", lambda m, a: a.norm(p="nuc", dim=(1, 2))),
    ("sort stable", lambda m, a: a.flatten().sort(stable=True, descending=True)),
    ("msort", lambda m, a: m.msort(a)),
    ("argsort stable", lambda m, a: m.argsort(m.tensor([2, 1, 2, 1]), stable=True)),
    ("bitwise ops", lambda m, a: (a.long() & 3) | (a.long() ^ 5)),
    ("shift", lambda m, a: a.long() << 2),
    ("floordiv op", lambda m, a: a // 3),
    ("mod op", lambda m, a: -a % 5),
    ("rpow", lambda m, a: 2 ** a[0]),
    ("matmul op", lambda m, a: a @ a.mT),
    ("comparison chain", lambda m, a: (a > 3) & (a <= 20)),
    ("neg bool", lambda m, a: ~(a > 3)),
    ("abs op", lambda m, a: abs(-a)),
    ("round ndigits", lambda m, a: round(a[0, 0, 1] / 3, 2)),
    ("float()", lambda m, a: float(a[0, 0, 1])),
    ("int()", lambda m, a: int(a[0, 0, 3])),
    ("bool() single", lambda m, a: bool(a[0, 0, 1])),
    ("len", lambda m, a: len(a)),
    ("iter", lambda m, a: [t.shape for t in a]),
    ("contains", lambda m, a: 5.0 in a),
    ("index()", lambda m, a: [10, 20, 30][a[0, 0, 1].long()]),
    ("divmod-ish", lambda m, a: (a // 7, a % 7)),
    ("hash dims", lambda m, a: a.dim()),
    ("real", lambda m, a: a.cfloat().real),
    ("imag", lambda m, a: (a.cfloat() * 1j).imag),
    ("angle", lambda m, a: a.cfloat().angle()),
]


def test_methods_properties_and_numpy_names_match_torch():
    fx = flow.from_torch(X)
    sweep(same_as_torch, [(name, lambda fn=fn: fn(torch, X), lambda fn=fn: fn(flow, fx)) for name, fn in METHODS])


def test_a_numpy_name_next_to_its_own_is_refused():
    with pytest.raises(TypeError, match="'dim' and its NumPy name 'axis'"):
        flow.arange(6.0).reshape(2, 3).sum(dim=0, axis=1)
