"""The directional SSM used as BiGS routing: one S4D kernel shared by every feature."""

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, Bool, Complex, Float, PRNGKeyArray, jaxtyped

from .._checks import (
    IntLike,
    RealScalar,
    as_arrays,
    check_bool,
    check_choice,
    check_float_dtype,
    check_int,
    check_key,
    check_mask_dtype,
    check_trailing_mask,
)
from .._numerics import rfft_conv
from ..ssm import S4DKernel
from ..ssm._chunked import _chunked_conv


def check_sequence(name: str, x: Array, mask: Array | None, dim: int) -> None:
    """A `ValueError` unless `x` is `(length >= 1, dim)` and `mask` (if any) `(length,)`,
    a `TypeError` unless `x` is real floating and `mask` boolean."""
    check_float_dtype(name, x)
    check_mask_dtype(mask)
    if x.ndim != 2 or x.shape[-1] != dim or x.shape[0] < 1:
        raise ValueError(
            f"{name} must have shape (length >= 1, dim={dim}), got {name}.shape={x.shape}"
        )
    if mask is not None and mask.shape != x.shape[:1]:
        raise ValueError(
            f"mask must have shape ({x.shape[0]},) like {name}, got mask.shape={mask.shape}"
        )


def chunked_ssm_conv(
    u: Float[Array, "directions length channels"],
    log_abar: Complex[Array, "directions modes"],
    cb: Complex[Array, "directions modes"],
    d: Float[Array, " directions"],
    *,
    reverse: tuple[bool, ...],
    chunk: IntLike | None = None,
) -> Float[Array, "directions length channels"]:
    """[`lineax_seq.chunked_conv`][] with one shared kernel per direction, all directions
    in one batched pass (`jax.vmap` over directions, `reverse` traced per direction).

    **Arguments:**

    - `u`: inputs, shape `(directions, length, channels)`.
    - `log_abar`, `cb`: each direction's discrete system, `Abar` by its log (the log of
        [`lineax_seq.S4DKernel.discretize`][]'s, computed without rounding `Abar`), shape
        `(directions, modes)`.
    - `d`: each direction's skip, shape `(directions,)`.
    - `reverse`: per direction, anti-causal instead of causal.
    - `chunk`: chunk size (default: [`lineax_seq.chunked_conv`][]'s).

    **Returns:**

    Shape `(directions, length, channels)`, in `u`'s dtype.
    """
    if len(reverse) != u.shape[0]:
        raise ValueError(
            f"reverse must have one entry per direction ({u.shape[0]}), got reverse={reverse!r}"
        )

    def one(u, log_abar, cb, d, rev):
        return _chunked_conv(u, log_abar[None], cb[None], d[None], reverse=rev, chunk=chunk)

    return jax.vmap(one)(u, log_abar, cb, d, jnp.asarray(reverse))


def ssm_conv(
    u: Float[Array, "directions length channels"], ssms: tuple["DirectionalSSM", ...]
) -> Float[Array, "directions length channels"]:
    """Apply one [`lineax_seq.DirectionalSSM`][] per direction (`y = K * u + D u`,
    causal or anti-causal as each one's `reverse`), all in one pass.

    Shared kernels: `chunked_ssm_conv` (a batched dense Toeplitz product up to 512
    positions at 32 modes or more, chunks above); per-channel kernels: one real FFT
    pair over both directions (an anti-causal one multiplies by its kernel's conjugate
    transform, so no array is flipped).

    **Arguments:**

    - `u`: inputs (already zero at padded positions), `(directions, length, channels)`.
    - `ssms`: one module per direction.

    **Returns:**

    Shape `(directions, length, channels)`.
    """
    length = u.shape[1]
    reverse = tuple(ssm.reverse for ssm in ssms)
    if any(ssm.kernel_fn.channels != 1 for ssm in ssms):
        k = jnp.stack([ssm.impulse_response(length) for ssm in ssms])  # rfft_conv casts
        return rfft_conv(u, k, anti_causal=reverse)
    systems = [ssm.kernel_fn._discretize() for ssm in ssms]
    log_abar = jnp.concatenate([a for a, _ in systems])
    cb = jnp.concatenate([c for _, c in systems])
    d = jnp.concatenate([ssm.d for ssm in ssms]).astype(u.dtype)
    return chunked_ssm_conv(u, log_abar, cb, d, reverse=reverse)


class DirectionalSSM(eqx.Module):
    """An S4D sequence map in one direction, `y = K * u + D u`, padding-aware.

    The paper's `SSM(.)`: a diagonal state-space model whose kernel `K` (from
    [`lineax_seq.S4DKernel`][]) is shared by all `dim` features (`kernel="shared"`, the
    BiGS choice), or one per feature (`kernel="per_channel"`), plus a skip `D`.

    With `reverse=False` it is causal (`y_t` reads `u_0..u_t`); with `reverse=True` it
    is anti-causal (`y_t` reads `u_t..u_{L-1}`), which equals `Flip(SSM(Flip(u)))`:
    the backward SSM of BiGS.

    **Computation.** A shared kernel is applied by [`lineax_seq.chunked_conv`][]: for
    `N >= 64` as one dense Toeplitz product up to 512 positions and by chunks of 256
    above (for smaller `N`, up to 256 and chunks of 128): Toeplitz products within
    chunks and the SSM's state (`N/2` complex modes) carried between them, all matrix
    products, which CPUs run much faster than FFTs (XLA's CPU FFT was the bottleneck at
    4k tokens). Per-channel kernels use one real FFT pair. Every path is exact (to float
    rounding).

    **Padding.** With a `mask`, padded positions of `u` are zeroed before the
    convolution, so they contribute nothing. Since the SSM is linear with zero initial
    state, the backward direction then starts exactly at each example's last real
    token: for trailing padding the outputs at real positions equal those of the
    unpadded sequence, for any amount and content of padding.
    """

    kernel_fn: S4DKernel
    d: Float[Array, " kc"]
    reverse: bool = eqx.field(static=True)
    dim: int = eqx.field(static=True)

    def __init__(
        self,
        dim: IntLike,
        *,
        reverse: bool = False,
        state_size: IntLike = 64,
        kernel: Literal["shared", "per_channel"] = "shared",
        init: Literal["lin", "inv", "real", "legs"] = "legs",
        dt_min: RealScalar = 0.01,
        dt_max: RealScalar = 1.0,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: number of features.
        - `reverse`: `False` for the forward (causal) direction, `True` for the backward
            (anti-causal) one.
        - `state_size`: SSM state size `N` (the paper uses 64).
        - `kernel`: `"shared"` (one kernel for all features, the paper's) or
            `"per_channel"`.
        - `init`, `dt_min`, `dt_max`: passed to [`lineax_seq.S4DKernel`][], whose `B`
            is then set to ones for every `init` (`"legs"` included), as in the paper's
            reference implementation (jxiw/BiGS). The step sizes
            start log-uniform in `[0.01, 1]`, the range of the paper's reference
            implementation (jxiw/BiGS), not S4's `[1e-3, 1e-1]`: pretrained on 128-token
            sequences, S4's slowest modes (time constant `~2 / dt_min` tokens) would
            outlast the sequence 15-fold.
        - `key`: a `jax.random.key`.
        """
        check_key("key", key)
        check_choice("kernel", kernel, ("shared", "per_channel"))
        check_bool("reverse", reverse)
        dim = check_int("dim", dim)
        channels = 1 if kernel == "shared" else dim
        kernel_fn = S4DKernel(
            state_size, channels, init=init, dt_min=dt_min, dt_max=dt_max, key=key
        )
        # `B` starts at 1 for every `init`: the reference (jxiw/BiGS) holds it at 1.
        self.kernel_fn = eqx.tree_at(
            lambda k: (k.b_real, k.b_imag),
            kernel_fn,
            (jnp.ones_like(kernel_fn.b_real), jnp.zeros_like(kernel_fn.b_imag)),
        )
        self.d = jnp.ones((channels,))
        self.reverse = reverse
        self.dim = dim

    def kernel(self, length: IntLike) -> Float[Array, "kc {length}"]:
        """The convolution kernel `K` at `length` (lag 0 first), shape `(kc, length)`,
        `kc` = 1 (shared) or `dim` (per channel). The skip `D` is not included."""
        return self.kernel_fn(length)

    def impulse_response(self, length: IntLike) -> Float[Array, "kc {length}"]:
        """`K` for `length` lags with the skip `D` added at lag 0, shape `(kc, length)`:
        `y = conv(impulse_response, u)`, in `K`'s dtype (float32 also for bfloat16 or
        float16 parameters)."""
        k = self.kernel_fn(length)
        return k.at[:, 0].add(self.d.astype(k.dtype))

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        u: Float[Array | np.ndarray, "length dim"],
        mask: Bool[Array | np.ndarray, " length"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "length dim"]:
        """Apply the SSM.

        **Arguments:**

        - `u`: input, shape `(length, dim)`, `length >= 1`.
        - `mask`: optional, `True` at real tokens, then `False` at trailing padding (any
            other mask is an error: at once, or at run time under `jit` or `jax.vmap`);
            padded positions are zeroed first.
        - `key`: ignored (the layer is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        `K * u + D u`, shape `(length, dim)` (zero at padded positions if `mask`), in
        `u`'s dtype, as [`lineax_seq.S4D`][] returns it (half-precision input is
        convolved in float32 and rounded once).
        """
        u, mask = as_arrays(u, mask)
        check_sequence("u", u, mask, self.dim)
        check_trailing_mask(mask)
        if mask is None:
            return ssm_conv(u[None], (self,))[0]
        y = ssm_conv(jnp.where(mask[:, None], u, 0)[None], (self,))[0]
        return jnp.where(mask[:, None], y, 0)
