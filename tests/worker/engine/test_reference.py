"""The float64 reference the paged backends are checked against: on whichever device the query
lives (the `gpu` layer checks CUDA outputs against it), computed there."""

import torch

from tests.worker.engine.reference import float64_attention


def test_the_causal_mask_is_built_on_the_querys_device():
    # The meta device stands in for CUDA here: a mask made on the CPU cannot fill scores that live
    # anywhere else ("Tensor on device meta is not on the expected device cpu!").
    q, k, v = (torch.empty(shape, device="meta") for shape in ((3, 4, 8), (5, 2, 8), (5, 2, 8)))
    assert float64_attention(q, k, v).device.type == "meta"
    assert float64_attention(q, k, v, window=2).shape == (3, 4, 8)


def test_the_reference_masks_the_future_and_the_window():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 4), torch.randn(4, 1, 4), torch.randn(4, 1, 4)
    v[3] = 100.0  # the last position: visible only to the last query
    got = float64_attention(q, k, v)
    assert got[0].abs().max() < 100 and got[1].abs().max() > 1  # query 0 sits at position 2
    # A window of one: each query sees only its own position's value.
    assert torch.allclose(float64_attention(q, k, v, window=1), v[2:].double().expand(2, 2, 4))
