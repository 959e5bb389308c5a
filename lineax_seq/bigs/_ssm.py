"""The directional SSM used as BiGS routing: one S4D kernel shared by every feature."""

import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Complex, Float, PRNGKeyArray

from ..ssm import S4DKernel, fft_conv
from ..ssm._fft_conv import _fft_size

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
    applied as a Toeplitz matrix product; otherwise by FFT (the anti-causal direction
    as a cross-correlation, `irfft(rfft(u) * conj(rfft(k)))`, so nothing is flipped).

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
    if not reverse:
        return fft_conv(u, k)
    return bidirectional_conv(u[:, None], k[None], reverse=(True,))[:, 0]


def bidirectional_conv(
    u: Float[Array, "length directions channels"],
    k: Float[Array, "directions kc length"],
    *,
    reverse: tuple[bool, ...],
) -> Float[Array, "length directions channels"]:
    """Several independent convolutions, causal or anti-causal, in one pass.

    For each direction `i`: `y[:, i] = shared_kernel_conv(u[:, i], k[i],
    reverse=reverse[i])`. BiGS's forward and backward SSMs go through ONE batched
    Toeplitz product (shared kernels, `length <= TOEPLITZ_MAX_LENGTH`) or ONE real FFT
    of all `directions * channels` signals and one inverse (zero-padded to `>= 2L`, so
    exact): a causal direction multiplies by `rfft(k)`, an anti-causal one by its
    conjugate (a cross-correlation), and no array is flipped.

    **Arguments:**

    - `u`: inputs, shape `(length, directions, channels)`.
    - `k`: kernels, shape `(directions, kc, length)`, `kc` = 1 (shared) or `channels`.
    - `reverse`: per direction, anti-causal instead of causal.

    **Returns:**

    Shape `(length, directions, channels)`, in `u`'s dtype.
    """
    length, directions, channels = u.shape
    if len(reverse) != directions:
        raise ValueError(f"reverse needs {directions} entries, got reverse={reverse!r}")
    if k.shape[1] == 1 and length <= TOEPLITZ_MAX_LENGTH:
        t = jnp.stack([_toeplitz(k[i, 0], r) for i, r in enumerate(reverse)])
        return jnp.einsum("dts,sdc->tdc", t, u).astype(u.dtype)
    n = _fft_size(2 * length)
    u_f = jnp.fft.rfft(u, n=n, axis=0)  # (n // 2 + 1, directions, channels)
    k_f = jnp.fft.rfft(k, n=n, axis=-1)  # (directions, kc, n // 2 + 1)
    k_f = jnp.stack([jnp.conj(k_f[i]) if r else k_f[i] for i, r in enumerate(reverse)])
    y = jnp.fft.irfft(u_f * jnp.transpose(k_f, (2, 0, 1)), n=n, axis=0)[:length]
    return y.astype(u.dtype)


def _chunk_size(length: int) -> int:
    """Chunks of at least 128 positions, and at most 64 chunks."""
    return max(128, 1 << max(0, math.ceil(math.log2(length / 64))))


def chunked_ssm_conv(
    u: Float[Array, "length directions channels"],
    abar: Complex[Array, "directions modes"],
    cb: Complex[Array, "directions modes"],
    d: Float[Array, " directions"],
    *,
    chunk: int | None = None,
) -> Float[Array, "length directions channels"]:
    """Causal convolution with diagonal-SSM kernels shared by all channels, by chunks.

    `y[t] = sum_{s <= t} K[t - s] u[s] + D u[t]` with `K[l] = 2 Re(sum_n CB_n Abar_n^l)`,
    for each direction. Equal to the FFT convolution, but made of matrix products,
    which CPUs (and accelerators) run far faster than FFTs: with chunks of `C`
    positions,

    * within a chunk: a `(C, C)` Toeplitz product;
    * each chunk's end state `S_q = sum_j Abar^(C-1-j) u_(qC+j)`: a `(modes, C)` product;
    * the states carried over chunks `H_q = sum_(p <= q) Abar^(C (q-p)) S_p`: a
        `(Q, Q)` product per mode (`Q = L / C` chunks, at most 64);
    * their effect `2 Re(sum_n CB_n Abar_n^(i+1) H_(q-1), n)` on offset `i` of chunk `q`.

    About `2 C + 8 modes` multiply-adds per position and channel, all in GEMMs.

    **Arguments:**

    - `u`: inputs, shape `(length, directions, channels)`.
    - `abar`, `cb`: each direction's discrete system (see
        [`lineax_seq.S4DKernel.discretize`][]), shape `(directions, modes)`.
    - `d`: each direction's skip, shape `(directions,)`.
    - `chunk`: chunk size `C` (default: 128, or more so that there are <= 64 chunks).

    **Returns:**

    Shape `(length, directions, channels)`, in `u`'s dtype.
    """
    length, directions, channels = u.shape
    c = _chunk_size(length) if chunk is None else chunk
    q = -(-length // c)
    u = jnp.pad(u, ((0, q * c - length), (0, 0), (0, 0))).reshape(q, c, directions, channels)
    log_abar = jnp.log(abar)[:, :, None]  # (z, n, 1)
    powers = lambda e: jnp.exp(log_abar * jnp.asarray(e, jnp.float32).astype(log_abar.dtype))
    offsets = jnp.arange(c)
    # Within chunks: the kernel's first C lags (skip at lag 0), as a Toeplitz matrix.
    k = 2 * jnp.einsum("zn,znl->zl", cb, powers(offsets)).real
    k = k.at[:, 0].add(d)
    lag = offsets[:, None] - offsets[None, :]
    t = jnp.where(lag >= 0, k[:, jnp.clip(lag, 0)], 0)  # (z, C, C)
    y = jnp.einsum("zij,qjzc->qizc", t.astype(u.dtype), u)
    # End-of-chunk states, real and imaginary parts of `sum_j Abar^(C-1-j) u_j`.
    w_in = powers(c - 1 - offsets)  # (z, n, C)
    w_in = jnp.concatenate([w_in.real, w_in.imag], axis=1).astype(u.dtype)
    states = jnp.einsum("znj,qjzc->zqnc", w_in, u)  # (z, Q, 2n, C)
    modes = abar.shape[1]
    states = jax.lax.complex(states[:, :, :modes], states[:, :, modes:])
    # Carry: H_q = sum_{p <= q} Abar^(C (q - p)) S_p, and its value entering chunk q.
    chunk_lag = jnp.arange(q)[:, None] - jnp.arange(q)[None, :]
    carry = powers(c * jnp.clip(chunk_lag, 0).reshape(-1)).reshape(directions, modes, q, q)
    carry = jnp.where(chunk_lag >= 0, carry, 0)
    h = jnp.einsum("znqp,zpnc->zqnc", carry, states)
    h = jnp.pad(h[:, :-1], ((0, 0), (1, 0), (0, 0), (0, 0)))  # state before chunk q
    # Effect on offset i: 2 Re(sum_n CB_n Abar_n^(i+1) H_n) = [2 Re V, -2 Im V] . [Re H, Im H].
    v = cb[:, :, None] * powers(offsets + 1)  # (z, n, C)
    w_out = 2 * jnp.concatenate([v.real, -v.imag], axis=1).astype(u.dtype)
    h = jnp.concatenate([h.real, h.imag], axis=2).astype(u.dtype)
    y = y + jnp.einsum("zni,zqnc->qizc", w_out, h)
    return y.reshape(q * c, directions, channels)[:length]


def ssm_conv(
    u: Float[Array, "length directions channels"], ssms: tuple["DirectionalSSM", ...]
) -> Float[Array, "length directions channels"]:
    """Apply one [`lineax_seq.DirectionalSSM`][] per direction (`y = K * u + D u`,
    causal or anti-causal as each one's `reverse`), all in one pass.

    Shared kernels: a Toeplitz product up to `TOEPLITZ_MAX_LENGTH`, chunks above
    (`chunked_ssm_conv`, anti-causal
    directions on the flipped sequence); per-channel kernels: one FFT pair.

    **Arguments:**

    - `u`: inputs (already zero at padded positions), `(length, directions, channels)`.
    - `ssms`: one module per direction.

    **Returns:**

    Shape `(length, directions, channels)`.
    """
    length = u.shape[0]
    reverse = tuple(ssm.reverse for ssm in ssms)
    shared = all(ssm.kernel_fn.channels == 1 for ssm in ssms)
    if shared and length > TOEPLITZ_MAX_LENGTH:
        systems = [ssm.kernel_fn.discretize() for ssm in ssms]
        abar = jnp.concatenate([a for a, _ in systems])
        cb = jnp.concatenate([c for _, c in systems])
        d = jnp.concatenate([ssm.d for ssm in ssms])
        flip = lambda v: jnp.stack(
            [v[::-1, i] if r else v[:, i] for i, r in enumerate(reverse)], axis=1
        )
        return flip(chunked_ssm_conv(flip(u), abar, cb, d.astype(u.dtype)))
    k = jnp.stack([ssm.impulse_response(length) for ssm in ssms]).astype(u.dtype)
    return bidirectional_conv(u, k, reverse=reverse)


class DirectionalSSM(eqx.Module):
    """An S4D sequence map in one direction, `y = K * u + D u`, padding-aware.

    The paper's `SSM(.)`: a diagonal state-space model whose kernel `K` (from
    [`lineax_seq.S4DKernel`][]) is shared by all `dim` features (`kernel="shared"`, the
    BiGS choice), or one per feature (`kernel="per_channel"`), plus a skip `D`.

    With `reverse=False` it is causal (`y_t` reads `u_0..u_t`); with `reverse=True` it
    is anti-causal (`y_t` reads `u_t..u_{L-1}`), which equals `Flip(SSM(Flip(u)))`:
    the backward SSM of BiGS.

    **Computation.** A shared kernel is applied as a dense Toeplitz product up to
    `TOEPLITZ_MAX_LENGTH = 256` positions, and above by chunks of 128 positions or
    more: Toeplitz products within chunks and the SSM's state (`N/2` complex modes)
    carried between them, all matrix products, which CPUs run much faster than FFTs
    (XLA's CPU FFT was the bottleneck at 4k tokens). Per-channel kernels use one real
    FFT pair. Every path is exact (to float rounding).

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

    def impulse_response(self, length: int) -> Float[Array, "kc {length}"]:
        """`K` with the skip `D` added at lag 0: `y = conv(impulse_response, u)`."""
        return self.kernel_fn(length).at[:, 0].add(self.d)

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
        return ssm_conv(u[:, None], (self,))[:, 0]
