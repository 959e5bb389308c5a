"""Equinox layers applied along a sequence without `vmap`, parameter counting, and loop
carries that vary like the data."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree


def apply_linear(linear: eqx.nn.Linear, x: Float[Array, "*batch a"]) -> Float[Array, "*batch b"]:
    """`x W^T + b` at every position of `x` (one matrix product, not a `vmap` of
    matrix-vector products)."""
    y = x @ linear.weight.T
    return y if linear.bias is None else y + linear.bias


def count_parameters(tree: PyTree) -> int:
    """Number of parameters (floating-point array elements) in a PyTree.

    Works on concrete models and on abstract ones, e.g.
    `count_parameters(eqx.filter_eval_shape(lambda: BiGS.from_config("bigs-large", key=k)))`
    counts BiGS-Large without allocating it.

    **Arguments:**

    - `tree`: any PyTree (an Equinox module), with JAX or NumPy arrays or `jax.ShapeDtypeStruct`s.

    **Returns:**

    The total number of elements of its floating-point (or complex) leaves.
    """
    leaves = jax.tree.leaves(tree)
    return int(
        sum(
            leaf.size
            for leaf in leaves
            if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct | np.ndarray)
            and jnp.issubdtype(leaf.dtype, jnp.inexact)
        )
    )


def varying_like(tree: PyTree, x: Array) -> PyTree:
    """`tree`'s arrays (the same values) as results of a computation on `x`.

    Under `jax.shard_map` a value computed from the per-device data varies over the
    mesh axes, one built from parameters or constants does not; a loop carry must keep
    its type, so one started from parameters and updated with data is refused. Started
    from `varying_like(init, x)` it varies as `x` does (outside `shard_map` the values
    are the same, at the cost of one addition per element).
    """
    return jax.tree.map(lambda a: a + jnp.zeros_like(x, shape=a.shape, dtype=a.dtype), tree)
