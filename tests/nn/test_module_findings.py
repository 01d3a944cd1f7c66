"""Minimized findings of the nn.Module fuzzer (tests/nn/test_fuzz_modules.py) and of the nn gaps
it points at, each against torch: values, gradients and exception classes."""
from __future__ import annotations

import warnings

import pytest
import torch

import holoflow as flow


def _raised(fn):
    try:
        fn()
    except Exception as e:   # noqa: BLE001 - compared by class
        return e
    return None


def _same_refusal(call) -> None:
    """``call(lib)`` raises in torch, and in holoflow with the same class."""
    want, got = _raised(lambda: call(torch)), _raised(lambda: call(flow))
    assert want is not None
    assert isinstance(got, type(want)), f"torch {type(want).__name__}: {want}; holoflow {got!r}"


@pytest.mark.parametrize("nested", [True, False])
def test_transformer_encoder_of_a_layer_without_self_attention(nested):
    """An encoder whose layers are not transformer layers (a Linear): torch's forward reads the
    first layer's ``self_attn.batch_first`` first (AttributeError); holoflow called the layer with
    the encoder's keyword arguments (TypeError)."""
    def call(lib):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = lib.nn.TransformerEncoder(lib.nn.Linear(4, 4), 2, enable_nested_tensor=nested)
        return m(lib.ones(2, 3, 4))
    _same_refusal(call)
