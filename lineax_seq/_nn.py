"""Equinox layers applied along a sequence without `vmap`."""

import equinox as eqx
from jaxtyping import Array, Float


def apply_linear(linear: eqx.nn.Linear, x: Float[Array, "*batch a"]) -> Float[Array, "*batch b"]:
    """`x W^T + b` at every position of `x` (one matrix product, not a `vmap` of
    matrix-vector products)."""
    y = x @ linear.weight.T
    return y if linear.bias is None else y + linear.bias
