"""Long convolutions via the real FFT."""

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import as_array, check_bool
from .._numerics import fft_size, rfft_conv, work_dtype


def fft_conv(
    u: Float[Array | np.ndarray, "length channels"],
    k: Float[Array | np.ndarray, "kc length"],
    k_backward: Float[Array | np.ndarray, "kc length"] | None = None,
    *,
    bidirectional: bool = False,
) -> Float[Array, "length channels"]:
    """Causal or bidirectional long convolution of each channel with its own kernel.

    Causal (`k_backward=None`):

    `y[t, c] = sum_{j=0}^{t} k[c, j] u[t - j, c]`.

    Bidirectional: the forward kernel covers lags `0, 1, ..., L-1` (the past and the
    present) and the backward kernel lags `-1, -2, ..., -(L-1)` (the future), so lag 0
    is counted once, from `k`:

    `y[t, c] = sum_{j=0}^{t} k[c, j] u[t - j, c]`
    `+ sum_{j=0}^{L-2-t} k_backward[c, j] u[t + 1 + j, c]`.

    (`k_backward[c, L-1]` is never used.) This is the convolution that a forward SSM
    plus a backward SSM over the strictly-future inputs compute.

    Zero-padded to an FFT length `>= 2L`, so there is no circular wrap-around. Like
    every FFT convolution it mixes all positions numerically: a non-finite input
    makes every output non-finite, the past included (the recurrent mode does not).

    **Arguments:**

    - `u`: input of shape `(length, channels)`, any float dtype (bfloat16 and float16
        are computed in float32). `u` and the kernels are JAX or NumPy arrays.
    - `k`: forward kernel of shape `(kc, length)`, as long as `u`, `kc` either
        `channels` (one kernel per channel) or `1` (one kernel shared by all channels).
    - `k_backward`: optional backward kernel of the same shape as `k`; giving it makes
        the convolution bidirectional.
    - `bidirectional`: with `k_backward=None`, read `k` as the forward kernels stacked
        over the backward ones, shape `(2 * kc, length)` (S4's convention: an
        `S4DKernel` with twice the channels). Ignored when `k_backward` is given.

    **Returns:**

    The output, of shape `(length, channels)`, in `u`'s dtype.
    """
    u, k = as_array("u", u), as_array("k", k)
    k_backward = as_array("k_backward", k_backward, optional=True)
    if u.ndim != 2:
        raise ValueError(f"u must have shape (length, channels), got u.shape={u.shape}")
    if not jnp.issubdtype(u.dtype, jnp.floating):
        raise TypeError(f"u must have a floating dtype, got u.dtype={u.dtype}")
    for name, kernel in (("k", k), ("k_backward", k_backward)):
        if kernel is not None and not jnp.issubdtype(kernel.dtype, jnp.floating):
            raise TypeError(
                f"{name} must have a real floating dtype (a complex kernel's imaginary part "
                f"would be dropped), got {name}.dtype={kernel.dtype}"
            )
    length, channels = u.shape
    bidirectional = check_bool("bidirectional", bidirectional)
    if bidirectional and k_backward is None:
        if k.ndim != 2 or k.shape[0] not in (2, 2 * channels) or k.shape[1] != length:
            raise ValueError(
                "With bidirectional=True and no k_backward, k must stack the forward over "
                f"the backward kernels, shape (2 * kc, length={length}) with kc = 1 or "
                f"channels={channels}, got k.shape={k.shape}"
            )
        k, k_backward = k[: k.shape[0] // 2], k[k.shape[0] // 2 :]
    if k.ndim != 2 or k.shape[0] not in (1, channels) or k.shape[1] != length:
        raise ValueError(
            f"k must have shape (kc, length={length}) with kc = 1 or channels={channels}, "
            f"got k.shape={k.shape}"
        )
    if k_backward is None:
        return rfft_conv(u, k)
    if k_backward.shape != k.shape:
        raise ValueError(
            f"k_backward must have the shape of k={k.shape}, "
            f"got k_backward.shape={k_backward.shape}"
        )
    # Circular tap n - 1 - j is lag -(j + 1).
    # (Kernels of two float dtypes are joined in the work dtype, neither rounded.)
    work = work_dtype(u.dtype)
    pad = jnp.zeros((k.shape[0], fft_size(2 * length) - 2 * length), work)
    k_full = jnp.concatenate([k.astype(work), pad, k_backward[:, ::-1].astype(work)], -1)
    return rfft_conv(u, k_full)
