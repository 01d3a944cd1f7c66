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
