"""holoflow dtypes: thin named handles over torch dtypes (the kernels' dtypes)."""
from __future__ import annotations

import builtins

import torch

# The package name dtypes and tensor types print with: "holoflow", or "torch" while
# holoflow.mock_torch is enabled (code written for torch compares str(x.dtype) == "torch.float32").
DISPLAY = ["holoflow"]


class dtype:
    """A tensor element type, e.g. ``holoflow.float32``; compares by identity like torch's."""

    __slots__ = ("name", "torch", "is_floating_point", "is_complex", "is_signed", "itemsize")

    def __init__(self, name: str, torch_dtype: torch.dtype) -> None:
        self.name = name
        self.torch = torch_dtype
        self.is_floating_point = torch_dtype.is_floating_point
        self.is_complex = torch_dtype.is_complex
        try:
            self.is_signed = torch_dtype.is_signed
        except RuntimeError:   # (torch's bit types answer no such question)
            self.is_signed = False
        self.itemsize = torch_dtype.itemsize

    def __repr__(self) -> str:
        return f"{DISPLAY[0]}.{self.name}"

    def __reduce__(self):  # pickles by name so dtypes survive worker processes
        return (_by_name, (self.name,))


float32 = dtype("float32", torch.float32)
float64 = dtype("float64", torch.float64)
float16 = dtype("float16", torch.float16)
bfloat16 = dtype("bfloat16", torch.bfloat16)
complex64 = dtype("complex64", torch.complex64)
complex128 = dtype("complex128", torch.complex128)
int8 = dtype("int8", torch.int8)
int16 = dtype("int16", torch.int16)
int32 = dtype("int32", torch.int32)
int64 = dtype("int64", torch.int64)
uint8 = dtype("uint8", torch.uint8)
bool = dtype("bool", torch.bool)  # noqa: A001 - torch's name
float, double, half = float32, float64, float16  # noqa: A001
int, long, short = int32, int64, int16  # noqa: A001
cfloat, cdouble = complex64, complex128

ALL = (float32, float64, float16, bfloat16, complex64, complex128, int8, int16, int32, int64, uint8, bool)

# torch's rarer element types (wider unsigned ints, float8/float4, complex32, sub-byte and bit
# types, quantized ones): few kernels take them, but a tensor of one still has a dtype, and
# ``holoflow.uint16`` names it as ``torch.uint16`` does
RARE = tuple(dtype(name, getattr(torch, name)) for name in (
    "uint16", "uint32", "uint64", "complex32", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "int1", "int2", "int3", "int4", "int5",
    "int6", "int7", "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7", "bits1x8", "bits2x4",
    "bits4x2", "bits8", "bits16", "qint8", "quint8", "qint32", "quint4x2", "quint2x4")
    if isinstance(getattr(torch, name, None), torch.dtype))
_FROM_TORCH = {d.torch: d for d in ALL + RARE}
_NAMES = {d.name: d for d in ALL + RARE}


def _by_name(name: str) -> dtype:
    return _NAMES[name]


_PY_TYPES = {builtins.float: None, builtins.int: torch.int64, builtins.bool: torch.bool,
             builtins.complex: torch.complex64}


def to_torch(d) -> torch.dtype | None:
    """Accepts a holoflow dtype, a torch dtype, a Python type, a name or None."""
    if d is None or isinstance(d, torch.dtype):
        return d
    if isinstance(d, dtype):
        return d.torch
    if d in _PY_TYPES:
        return _PY_TYPES[d] or torch.get_default_dtype()
    if isinstance(d, str) and d in _NAMES:
        return _NAMES[d].torch
    raise TypeError(f"holoflow: {d!r} is not a dtype; use one of holoflow.float32, holoflow.int64, ...")


def type_name(t: torch.Tensor) -> str:
    """torch's legacy type string of a tensor (``FloatTensor``, ``cuda.LongTensor``) under the
    display name: ``holoflow.FloatTensor``, or ``torch.FloatTensor`` under mock_torch."""
    return DISPLAY[0] + t.type()[len("torch"):]


def scalar_name(d: torch.dtype) -> str:
    """torch's name of a dtype in its messages (``Float``, ``Long``, ``BFloat16``)."""
    return torch.empty(0, dtype=d).type().rsplit(".", 1)[-1][:-len("Tensor")]


def from_type_name(name: str) -> dtype:
    """The dtype of a legacy type string (``"torch.LongTensor"``, ``"holoflow.cuda.FloatTensor"``)."""
    base = name.rsplit(".", 1)[-1]
    probe = torch.empty(0, dtype=torch.float32)
    for d in ALL:
        if probe.to(d.torch).type().rsplit(".", 1)[-1] == base:
            return d
    raise TypeError(f"holoflow: {name!r} is not a tensor type; use e.g. 'torch.FloatTensor' or a dtype")


def from_torch(d: torch.dtype) -> dtype:
    return _FROM_TORCH[d]


def get_default_dtype() -> dtype:
    return _FROM_TORCH[torch.get_default_dtype()]


def set_default_dtype(d) -> None:
    torch.set_default_dtype(to_torch(d))


def finfo(d=None) -> torch.finfo:
    return torch.finfo(to_torch(d) if d is not None else torch.get_default_dtype())


def iinfo(d) -> torch.iinfo:
    return torch.iinfo(to_torch(d))


def promote_types(a, b) -> dtype:
    return from_torch(torch.promote_types(to_torch(a), to_torch(b)))
