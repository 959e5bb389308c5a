"""Working precision and the FFT convolution core shared by the layers."""

from collections.abc import Sequence

import jax.numpy as jnp
from jaxtyping import Array, Float


def work_dtype(dtype) -> type:
    """The real dtype that FFTs, complex arithmetic, softmaxes and reductions run in:
    float64 stays float64, anything else (float32, bfloat16, float16) is float32."""
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def fft_size(minimum: int) -> int:
    """Smallest `2^a 3^b 5^c >= minimum` (sizes the FFT libraries handle fastest)."""
    best = 1 << max(minimum - 1, 0).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            size = p35
            while size < minimum:
                size *= 2
            best = min(best, size)
            p35 *= 3
        p5 *= 5
    return best


def rfft_conv(
    u: Float[Array, "*#batch length channels"],
    k: Float[Array, "*#batch kc taps"],
    *,
    anti_causal: bool | Sequence[bool] = False,
) -> Float[Array, "... length channels"]:
    """`y[..., t, c] = sum_j k[..., c, j] u[..., t - j, c]` by one real FFT pair,
    zero-padded to `n = fft_size(2 * length)` (no wrap-around); leading axes broadcast.

    `k` holds lags `0, 1, ...` in its first `length` taps; taps up to `n` are circular,
    so tap `n - 1 - j` is lag `-(j + 1)` (a bidirectional kernel). An `anti_causal`
    kernel (one flag per entry of `k`'s first axis, or one for all) is read backwards,
    `y[..., t, c] = sum_j k[..., c, j] u[..., t + j, c]`: its transform is conjugated,
    so no array is flipped. Computed in `work_dtype(u.dtype)`, returned in `u`'s dtype.
    """
    length = u.shape[-2]
    n = fft_size(2 * length)
    work = work_dtype(u.dtype)
    u_f = jnp.fft.rfft(u.astype(work), n=n, axis=-2)  # (..., n // 2 + 1, channels)
    k_f = jnp.fft.rfft(k.astype(work), n=n, axis=-1)  # (..., kc, n // 2 + 1)
    if isinstance(anti_causal, bool):
        k_f = jnp.conj(k_f) if anti_causal else k_f
    else:
        k_f = jnp.stack([jnp.conj(f) if r else f for f, r in zip(k_f, anti_causal, strict=True)])
    y = jnp.fft.irfft(u_f * jnp.swapaxes(k_f, -1, -2), n=n, axis=-2)[..., :length, :]
    return y.astype(u.dtype)
