"""The directional SSM used as BiGS routing: one S4D kernel shared by every feature."""

from typing import Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from ..ssm import S4DKernel, fft_conv

# Up to this length a kernel shared by all features is applied as one dense Toeplitz
# matrix product (`2 L^2 d` flops, a single GEMM that also batches over examples); above
# it, by FFT (`O(d L log L)`). The crossover on CPUs and accelerators is a few hundred.
TOEPLITZ_MAX_LENGTH = 256


def _toeplitz(k: Float[Array, " length"], reverse: bool) -> Float[Array, "length length"]:
    """`T[t, s] = k[t - s]` for `t >= s` (zero above the diagonal); transposed if `reverse`."""
    length = k.shape[0]
    lag = jnp.arange(length)[:, None] - jnp.arange(length)[None, :]
    padded = jnp.concatenate([k, jnp.zeros((1,), k.dtype)])
    t = padded[jnp.where(lag >= 0, lag, length)]
    return t.T if reverse else t


def shared_kernel_conv(
    u: Float[Array, "length channels"],
    k: Float[Array, "kc length"],
    *,
    reverse: bool = False,
) -> Float[Array, "length channels"]:
    """Causal (or anti-causal) convolution of every channel with its kernel.

    `reverse=False`: `y[t] = sum_{j <= t} k[t - j] u[j]`; `reverse=True`:
    `y[t] = sum_{j >= t} k[j - t] u[j]`, i.e. `Flip(conv(Flip(u)))`.

    A kernel shared by all channels (`kc = 1`) at length `<= TOEPLITZ_MAX_LENGTH` is
    applied as a Toeplitz matrix product; otherwise [`lineax_seq.fft_conv`][] is used.

    **Arguments:**

    - `u`: input, shape `(length, channels)`.
    - `k`: kernel, shape `(1, length)` (shared) or `(channels, length)`.
    - `reverse`: anti-causal instead of causal.

    **Returns:**

    Shape `(length, channels)`.
    """
    length = u.shape[0]
    if k.shape[0] == 1 and length <= TOEPLITZ_MAX_LENGTH:
        return (_toeplitz(k[0], reverse) @ u).astype(u.dtype)
    if reverse:
        return fft_conv(u[::-1], k)[::-1]
    return fft_conv(u, k)


class DirectionalSSM(eqx.Module):
    """An S4D sequence map in one direction, `y = K * u + D u`, padding-aware.

    The paper's `SSM(.)`: a diagonal state-space model whose kernel `K` (from
    [`lineax_seq.S4DKernel`][]) is shared by all `dim` features (`kernel="shared"`, the
    BiGS choice), or one per feature (`kernel="per_channel"`), plus a skip `D`.

    With `reverse=False` it is causal (`y_t` reads `u_0..u_t`); with `reverse=True` it
    is anti-causal (`y_t` reads `u_t..u_{L-1}`), which equals `Flip(SSM(Flip(u)))`:
    the backward SSM of BiGS without materialising any flip.

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
        dim: int,
        *,
        reverse: bool = False,
        state_size: int = 64,
        kernel: Literal["shared", "per_channel"] = "shared",
        init: Literal["lin", "inv", "real", "legs"] = "legs",
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: number of features.
        - `reverse`: `False` for the forward (causal) direction, `True` for the backward
            (anti-causal) one.
        - `state_size`: SSM state size `N` (the paper uses 64).
        - `kernel`: `"shared"` (one kernel for all features, the paper's) or
            `"per_channel"`.
        - `init`, `dt_min`, `dt_max`: passed to [`lineax_seq.S4DKernel`][].
        - `key`: a `jax.random.key`.
        """
        if kernel not in ("shared", "per_channel"):
            raise ValueError(f"kernel must be 'shared' or 'per_channel', got kernel={kernel!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got dim={dim!r}")
        channels = 1 if kernel == "shared" else dim
        self.kernel_fn = S4DKernel(
            state_size, channels, init=init, dt_min=dt_min, dt_max=dt_max, key=key
        )
        self.d = jnp.ones((channels,))
        self.reverse = reverse
        self.dim = dim

    def kernel(self, length: int) -> Float[Array, "kc {length}"]:
        """The convolution kernel `K` at `length` (lag 0 first), shape `(kc, length)`,
        `kc` = 1 (shared) or `dim` (per channel). The skip `D` is not included."""
        return self.kernel_fn(length)

    def __call__(
        self, u: Float[Array, "length dim"], mask: Bool[Array, " length"] | None = None
    ) -> Float[Array, "length dim"]:
        """Apply the SSM.

        **Arguments:**

        - `u`: input, shape `(length, dim)`.
        - `mask`: optional, `True` at real tokens; padded positions are zeroed first.

        **Returns:**

        `K * u + D u`, shape `(length, dim)` (zero at padded positions if `mask`).
        """
        if mask is not None:
            u = jnp.where(mask[:, None], u, 0)
        k = self.kernel_fn(u.shape[0]).astype(u.dtype)
        return shared_kernel_conv(u, k, reverse=self.reverse) + self.d.astype(u.dtype) * u
