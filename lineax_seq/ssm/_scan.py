"""Parallel linear recurrences."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Inexact

from .._checks import as_array, check_bool


def _matvec(a: Array, x: Array) -> Array:
    return jnp.einsum("...ij,...j->...i", a, x, precision=jax.lax.Precision.HIGHEST)


def _matmul(a: Array, b: Array) -> Array:
    return jnp.einsum("...ij,...jk->...ik", a, b, precision=jax.lax.Precision.HIGHEST)


def _dense_combine(earlier, later):
    a1, b1 = earlier
    a2, b2 = later
    return _matmul(a2, a1), _matvec(a2, b1) + b2


def _diagonal_combine(earlier, later):
    a1, b1 = earlier
    a2, b2 = later
    return a2 * a1, a2 * b1 + b2


def linear_scan(
    a: Inexact[Array | np.ndarray, "length n"] | Inexact[Array | np.ndarray, "length n n"],
    b: Inexact[Array | np.ndarray, "length n"],
    *,
    reverse: bool = False,
    initial: Inexact[Array | np.ndarray, " n"] | None = None,
) -> Inexact[Array, "length n"]:
    """Solve the linear recurrence `x_t = a_t x_{t-1} + b_t` in parallel.

    Uses `jax.lax.associative_scan` with the composition of affine maps
    `(a_2, b_2) o (a_1, b_1) = (a_2 a_1, a_2 b_1 + b_2)`: `O(log L)` depth,
    `O(L)` work (times `n^2` / `n^3` for dense `a`).

    With `reverse=True` the recurrence runs backwards in time:
    `x_t = a_t x_{t+1} + b_t`.

    **Arguments:**

    - `a`: the transitions, either diagonal, of shape `(length, n)` (elementwise
        product), or dense, of shape `(length, n, n)` (matrix-vector product).
    - `b`: the inputs, of shape `(length, n)`.
    - `reverse`: run from `t = length - 1` down to `0`.
    - `initial`: the state before the first step (`x_{-1}`, or `x_{length}` when
        `reverse=True`), of shape `(n,)`; zero if `None`.

    **Returns:**

    All states `x_0, ..., x_{length-1}`, of shape `(length, n)`.

    Real and complex dtypes both work; `a`, `b` (and `initial`) must share one dtype.
    NumPy arrays are accepted.
    """
    a, b = as_array("a", a), as_array("b", b)
    initial = as_array("initial", initial, optional=True)
    if b.ndim != 2 or b.shape[0] < 1:
        raise ValueError(f"b must have shape (length, n) with length >= 1, got b.shape={b.shape}")
    if a.ndim not in (2, 3):
        raise ValueError(f"a must have shape (length, n) or (length, n, n), got a.shape={a.shape}")
    dense = a.ndim == 3
    if a.shape[0] != b.shape[0] or a.shape[1] != b.shape[1] or (dense and a.shape[2] != b.shape[1]):
        raise ValueError(
            f"a must have shape (length, n) or (length, n, n) matching b.shape={b.shape}, "
            f"got a.shape={a.shape}"
        )
    check_bool("reverse", reverse)
    if not jnp.issubdtype(b.dtype, jnp.inexact):
        raise TypeError(f"b must have a floating or complex dtype, got b.dtype={b.dtype}")
    arrays = (("a", a), ("initial", initial))
    for name, x in arrays:
        if x is not None and x.dtype != b.dtype:
            raise TypeError(f"{name} must have b's dtype {b.dtype}, got {name}.dtype={x.dtype}")
    if initial is not None:
        if initial.shape != b.shape[1:]:
            raise ValueError(
                f"initial must have shape {b.shape[1:]}, got initial.shape={initial.shape}"
            )
        first = -1 if reverse else 0
        push = _matvec(a[first], initial) if dense else a[first] * initial
        b = b.at[first].add(push)
    combine = _dense_combine if dense else _diagonal_combine
    _, x = jax.lax.associative_scan(combine, (a, b), reverse=reverse)
    return x
