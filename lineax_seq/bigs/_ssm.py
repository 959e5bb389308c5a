"""The directional SSM used as BiGS routing: one S4D kernel shared by every feature."""

import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Complex, Float, PRNGKeyArray

from ..ssm import S4DKernel
from ..ssm._fft_conv import _fft_size

# Up to this length a kernel shared by all features is applied as one dense Toeplitz
# matrix product (`2 L` flops per position and feature, one GEMM); above it, by chunks
# (`chunked_ssm_conv`, about `2 C + 8 modes` flops per position and feature, GEMMs).
TOEPLITZ_MAX_LENGTH = 256


def _toeplitz(k: Float[Array, " length"], reverse: bool) -> Float[Array, "length length"]:
    """`T[t, s] = k[t - s]` for `t >= s` (zero above the diagonal); transposed if `reverse`."""
    length = k.shape[0]
    lag = jnp.arange(length)[:, None] - jnp.arange(length)[None, :]
    padded = jnp.concatenate([k, jnp.zeros((1,), k.dtype)])
    t = padded[jnp.where(lag >= 0, lag, length)]
    return t.T if reverse else t


def _chunk_size(length: int) -> int:
    """Chunks of at least 128 positions, and at most 64 chunks."""
    return max(128, 1 << max(0, math.ceil(math.log2(length / 64))))


def chunked_ssm_conv(
    u: Float[Array, "directions length channels"],
    abar: Complex[Array, "directions modes"],
    cb: Complex[Array, "directions modes"],
    d: Float[Array, " directions"],
    *,
    reverse: tuple[bool, ...],
    chunk: int | None = None,
) -> Float[Array, "directions length channels"]:
    """Convolution with diagonal-SSM kernels shared by all channels, by chunks.

    For each direction, causal: `y[t] = sum_{s <= t} K[t - s] u[s] + D u[t]`, or
    anti-causal (`reverse`): `y[t] = sum_{s >= t} K[s - t] u[s] + D u[t]`, with
    `K[l] = 2 Re(sum_n CB_n Abar_n^l)`. Equal to the FFT convolution, but made of
    matrix products, which CPUs (and accelerators) run far faster than FFTs. With
    chunks of `C` positions (causal direction; the anti-causal one mirrors it):

    * within a chunk: a `(C, C)` Toeplitz product;
    * each chunk's end state `S_q = sum_j Abar^(C-1-j) u_(qC+j)`: a `(modes, C)` product;
    * the states carried over chunks `H_q = sum_(p <= q) Abar^(C (q-p)) S_p`: a
        `(Q, Q)` product per mode (`Q = L / C` chunks, at most 64);
    * their effect `2 Re(sum_n CB_n Abar_n^(i+1) H_(q-1), n)` on offset `i` of chunk `q`.

    About `2 C + 8 modes` flops per position and channel, in batched GEMMs over
    (direction, chunk), with no transposes of the `(length, channels)` data.

    **Arguments:**

    - `u`: inputs, shape `(directions, length, channels)`.
    - `abar`, `cb`: each direction's discrete system (see
        [`lineax_seq.S4DKernel.discretize`][]), shape `(directions, modes)`.
    - `d`: each direction's skip, shape `(directions,)`.
    - `reverse`: per direction, anti-causal instead of causal.
    - `chunk`: chunk size `C` (default: 128, or more so that there are <= 64 chunks).

    **Returns:**

    Shape `(directions, length, channels)`, in `u`'s dtype.
    """
    directions, length, channels = u.shape
    c = _chunk_size(length) if chunk is None else chunk
    q = -(-length // c)
    modes = abar.shape[1]
    u = jnp.pad(u, ((0, 0), (0, q * c - length), (0, 0))).reshape(directions, q, c, channels)
    log_abar = jnp.log(abar)[:, :, None]  # (z, n, 1)
    rev = jnp.asarray(reverse)[:, None]  # (z, 1)

    def powers(e):  # Abar^e, e: (z, m) -> (z, n, m)
        return jnp.exp(log_abar * e[:, None, :].astype(jnp.float32).astype(log_abar.dtype))

    o = jnp.broadcast_to(jnp.arange(c), (directions, c))
    # Within chunks: the kernel's first C lags (skip at lag 0), as Toeplitz matrices.
    k = 2 * jnp.einsum("zn,znl->zl", cb, powers(o)).real + jnp.where(o == 0, d[:, None], 0)
    lag = o[:, :, None] - o[:, None, :]  # (z, i, j): i - j
    lag = jnp.where(rev[:, :, None], -lag, lag)
    t = jnp.where(
        lag >= 0,
        jnp.take_along_axis(k, jnp.clip(lag, 0).reshape(directions, -1), 1).reshape(lag.shape),
        0,
    ).astype(u.dtype)
    batched = lambda a: jnp.broadcast_to(a[:, None], (directions, q, *a.shape[1:]))
    y = jnp.einsum("zqij,zqjc->zqic", batched(t), u)
    # Chunk states (real and imaginary parts): causal sum_j Abar^(C-1-j) u_j (the state
    # after the chunk), anti-causal sum_j Abar^j u_j (the state before it, seen from the
    # right).
    w_in = powers(jnp.where(rev, o, c - 1 - o))  # (z, n, C)
    w_in = jnp.concatenate([w_in.real, w_in.imag], axis=1).astype(u.dtype)
    states = jnp.einsum("zqnj,zqjc->zqnc", batched(w_in), u)  # (z, Q, 2n, channels)
    states = jax.lax.complex(states[:, :, :modes], states[:, :, modes:])
    # Carried: H_q = sum over chunks p on q's side (p <= q causal, p >= q anti-causal)
    # of Abar^(C |q - p|) S_p.
    chunk_lag = jnp.arange(q)[:, None] - jnp.arange(q)[None, :]  # q - p
    chunk_lag = jnp.where(rev[:, :, None], -chunk_lag, chunk_lag)  # (z, Q, Q)
    carry = powers(c * jnp.clip(chunk_lag, 0).reshape(directions, -1))
    carry = jnp.where(chunk_lag[:, None] >= 0, carry.reshape(directions, modes, q, q), 0)
    h = jnp.einsum("znqp,zpnc->zqnc", carry, states)
    # The state entering chunk q: from chunk q - 1 (causal) or q + 1 (anti-causal).
    zeros = jnp.zeros_like(h[:, :1])
    h = jnp.stack(
        [
            jnp.concatenate([h[i, 1:], zeros[i]]) if r else jnp.concatenate([zeros[i], h[i, :-1]])
            for i, r in enumerate(reverse)
        ]
    )
    # Its effect on offset i: 2 Re(sum_n CB_n Abar_n^e H_n), e = i + 1 (causal) or
    # C - i (anti-causal); as [2 Re V, -2 Im V] . [Re H, Im H].
    v = cb[:, :, None] * powers(jnp.where(rev, c - o, o + 1))  # (z, n, C)
    w_out = 2 * jnp.concatenate([v.real, -v.imag], axis=1).astype(u.dtype)  # (z, 2n, C)
    h = jnp.concatenate([h.real, h.imag], axis=2).astype(u.dtype)  # (z, Q, 2n, channels)
    y = y + jnp.einsum("zqin,zqnc->zqic", batched(jnp.swapaxes(w_out, 1, 2)), h)
    return y.reshape(directions, q * c, channels)[:, :length]


def fft_ssm_conv(
    u: Float[Array, "directions length channels"],
    k: Float[Array, "directions kc length"],
    *,
    reverse: tuple[bool, ...],
) -> Float[Array, "directions length channels"]:
    """Causal or anti-causal convolutions by one real FFT pair over all directions.

    Zero-padded to `>= 2L` (exact); an anti-causal direction multiplies by the
    conjugate of `rfft(k)` (a cross-correlation), so no array is flipped.

    **Arguments:**

    - `u`: inputs, shape `(directions, length, channels)`.
    - `k`: kernels (lag 0 first), shape `(directions, kc, length)`, `kc` = 1 or
        `channels`.
    - `reverse`: per direction, anti-causal instead of causal.

    **Returns:**

    Shape `(directions, length, channels)`, in `u`'s dtype.
    """
    length = u.shape[1]
    n = _fft_size(2 * length)
    u_f = jnp.fft.rfft(u, n=n, axis=1)  # (z, n // 2 + 1, channels)
    k_f = jnp.fft.rfft(k, n=n, axis=-1)  # (z, kc, n // 2 + 1)
    k_f = jnp.stack([jnp.conj(k_f[i]) if r else k_f[i] for i, r in enumerate(reverse)])
    y = jnp.fft.irfft(u_f * jnp.swapaxes(k_f, 1, 2), n=n, axis=1)[:, :length]
    return y.astype(u.dtype)


def ssm_conv(
    u: Float[Array, "directions length channels"], ssms: tuple["DirectionalSSM", ...]
) -> Float[Array, "directions length channels"]:
    """Apply one [`lineax_seq.DirectionalSSM`][] per direction (`y = K * u + D u`,
    causal or anti-causal as each one's `reverse`), all in one pass.

    Shared kernels: a batched dense Toeplitz product up to `TOEPLITZ_MAX_LENGTH`,
    `chunked_ssm_conv` above; per-channel kernels: `fft_ssm_conv`.

    **Arguments:**

    - `u`: inputs (already zero at padded positions), `(directions, length, channels)`.
    - `ssms`: one module per direction.

    **Returns:**

    Shape `(directions, length, channels)`.
    """
    length = u.shape[1]
    reverse = tuple(ssm.reverse for ssm in ssms)
    if any(ssm.kernel_fn.channels != 1 for ssm in ssms):
        k = jnp.stack([ssm.impulse_response(length) for ssm in ssms]).astype(u.dtype)
        return fft_ssm_conv(u, k, reverse=reverse)
    if length <= TOEPLITZ_MAX_LENGTH:
        k = [ssm.impulse_response(length)[0].astype(u.dtype) for ssm in ssms]
        t = jnp.stack([_toeplitz(ki, r) for ki, r in zip(k, reverse, strict=True)])
        return jnp.einsum("zts,zsc->ztc", t, u)
    systems = [ssm.kernel_fn.discretize() for ssm in ssms]
    abar = jnp.concatenate([a for a, _ in systems])
    cb = jnp.concatenate([c for _, c in systems])
    d = jnp.concatenate([ssm.d for ssm in ssms]).astype(u.dtype)
    return chunked_ssm_conv(u, abar, cb, d, reverse=reverse)


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
        return ssm_conv(u[None], (self,))[0]
