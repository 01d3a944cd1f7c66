"""A wrongly typed argument gets torch's TypeError naming it (``holoflow.tril(): argument 'input'
(position 1) must be Tensor, not str``) from every tensor function, not an AttributeError from
inside holoflow (what most of them raised); and NumPy's ``axis=``/``keepdims=`` are taken where
torch takes them (compat.torch_arguments). Swept over every one-tensor function holoflow shares
with torch."""
from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import holoflow as flow
from ops.test_unary_dtypes import NAMES

# torch's functions removed since 1.9 (holoflow names their replacement whatever the arguments)
REMOVED = {"lstsq", "solve", "eig", "symeig", "matrix_rank"}


def _raised(fn) -> BaseException | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except Exception as e:
        return e
    return None


@pytest.mark.parametrize("bad", ["abc", None, [1.0, 2.0]], ids=["str", "None", "list"])
def test_a_non_tensor_input_is_torchs_type_error(bad):
    mismatches = []
    checked = 0
    for name in NAMES:
        try:
            params = list(inspect.signature(getattr(flow, name)).parameters.values())
        except (TypeError, ValueError):   # (a class without a signature, torch's own)
            continue
        if not params or params[0].annotation != "Tensor" or name in REMOVED:   # (tensor functions)
            continue
        want = _raised(lambda: getattr(torch, name)(bad))
        if not isinstance(want, TypeError):
            continue
        checked += 1
        got = _raised(lambda: getattr(flow, name)(bad))
        if not isinstance(got, TypeError):
            mismatches.append(f"{name}: {type(got).__name__}: {got}")
    assert not mismatches, "\n".join(mismatches[:20])
    assert checked > 100


def test_the_type_error_names_the_argument_and_its_position():
    with pytest.raises(TypeError, match=r"holoflow.tril\(\): argument 'input' \(position 1\) must be Tensor, not str"):
        flow.tril("abc")
    with pytest.raises(TypeError, match=r"argument 'input' \(position 1\) must be Tensor, not NoneType"):
        flow.nn.functional.relu(None)


_SIZES_AS_ONE_SEQUENCE = {
    "reshape(x, 3, 2)": lambda lib, x: lib.reshape(x, 3, 2),
    "reshape(x, 6)": lambda lib, x: lib.reshape(x, 6),
    "permute(x, 1, 0)": lambda lib, x: lib.permute(x, 1, 0),
    "permute(x, 1)": lambda lib, x: lib.permute(x, 1),
    "logsumexp(x, None)": lambda lib, x: lib.logsumexp(x, None),
    "x.logsumexp(None)": lambda lib, x: x.logsumexp(None),
}
_TAKEN = {
    "reshape(x, shape=(3, 2))": lambda lib, x: lib.reshape(x, shape=(3, 2)),
    "reshape(x, [6])": lambda lib, x: lib.reshape(x, [6]),
    "permute(x, dims=(1, 0))": lambda lib, x: lib.permute(x, dims=(1, 0)),
    "x.permute(1, 0)": lambda lib, x: x.permute(1, 0),
    "x.reshape(3, 2)": lambda lib, x: x.reshape(3, 2),
    "Tensor.reshape(x, 3, 2)": lambda lib, x: lib.Tensor.reshape(x, 3, 2),
}


@pytest.mark.parametrize("call", sorted(_SIZES_AS_ONE_SEQUENCE))
def test_function_forms_take_their_sizes_as_torchs_parser(call):
    """torch's function forms take the sizes as one sequence (``torch.reshape(x, (3, 2))``; the
    methods also as ints) and logsumexp's dim is not optional: each a TypeError there. holoflow
    took them all (op fuzzer seeds 120, 145 and 49 more)."""
    want = _raised(lambda: _SIZES_AS_ONE_SEQUENCE[call](torch, torch.ones(2, 3)))
    got = _raised(lambda: _SIZES_AS_ONE_SEQUENCE[call](flow, flow.ones(2, 3)))
    assert isinstance(want, TypeError) and isinstance(got, TypeError), (want, got)


@pytest.mark.parametrize("call", sorted(_TAKEN))
def test_the_forms_torch_takes_still_work(call):
    want = _TAKEN[call](torch, torch.arange(6.0).reshape(2, 3))
    got = _TAKEN[call](flow, flow.arange(6.0).reshape(2, 3))
    assert torch.equal(got.to_torch(), want)
