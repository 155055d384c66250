"""Gemma's GELU: computed in float32, it must round exactly as torch's bfloat16 kernel does."""

import torch
import torch.nn.functional as F
from intentserve.worker.model.gemma import gelu_tanh


def test_gelu_tanh_equals_torchs_bfloat16_gelu_for_every_bfloat16_value():
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x = every.view(torch.bfloat16)
    x = x[~x.isnan()].reshape(-1, 2)  # [N, 2]: a matrix, as in the MLP
    ours, theirs = gelu_tanh(x), F.gelu(x, approximate="tanh")
    assert ours.dtype == torch.bfloat16
    same = (ours == theirs) | (ours.isnan() & theirs.isnan())
    assert bool(same.all())


def test_gelu_tanh_in_float32_is_torchs():
    x = torch.randn(4, 64) * 4
    assert torch.equal(gelu_tanh(x), F.gelu(x, approximate="tanh"))
