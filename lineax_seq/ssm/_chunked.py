"""Exact convolution with a diagonal-SSM kernel by chunks: matrix products, no FFT."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Complex, Float

from .._checks import IntLike, as_array, check_float_dtype, check_int
from .._numerics import work_dtype
from ._kernel import LOG_ZERO
from ._scan import linear_scan

_HIGHEST = jax.lax.Precision.HIGHEST


def _isolated_einsum(spec: str, *operands: Array) -> Array:
    """`jnp.einsum(spec, *operands)` at HIGHEST precision, each operand and the result
    (so, in a backward pass, its cotangent) behind its own optimisation barrier.

    XLA:GPU fuses the transposes, slices and bias additions that produce such operands
    into a Triton GEMM. At HIGHEST precision, with a batch axis that a fused transpose
    made minor, its autotuner found no configuration to compile (H200, jax 0.11.2: a BST
    layer's block-end states at length 16k; a BST LM's chunked convolution in a train
    step). Behind the barriers the product is a plain batched GEMM. One barrier per
    operand: under `jax.jvp` an operand without a tangent then adds no zero product.
    """
    isolated = [jax.lax.optimization_barrier(a) for a in operands]
    return jax.lax.optimization_barrier(jnp.einsum(spec, *isolated, precision=_HIGHEST))


def _default_chunk(length: int, kc: int, modes: int) -> int:
    """The default chunk size `C` of `chunked_conv`.

    The in-chunk product costs `2 C` flops per position, the carried state about
    `8 modes` plus a scan over `L / C` chunks (memory-bound on CPU: fewer, larger
    chunks pay off when the state is wide).

    - Shared kernel (`kc = 1`, one `(C, C)` Toeplitz matrix): 256 for 32 modes or more,
        else 128; one chunk (a dense Toeplitz product) when `length <= 2 C`. Measured
        on CPU: at 32 modes (BiGS, 8 x 256 channels) 256 beat 128 by 1.0-1.2x forward
        and 1.2-1.3x in the gradient at 1k-4k, and one dense product beat chunks of 128
        by 1.4x / 2x at 512; at 8 modes (128 channels, batch 1) 128 beat 256 by
        1.15-1.5x at 1k-4k (a tie at 16k-32k) and chunks of 1,024 by 1.7-1.9x at 64k.
    - Per channel, where `(kc, C, C)` would grow: 64, or 128 for 32 modes or more on
        inputs longer than 8,192. At 8 modes 64 beat 128 at 1k-16k by 1.05-2.6x; at 32
        modes by 1.3-2.6x at 1k-4k, and 128 beat 64 by 1.1-1.2x at 16k.

    Never more than `length`.
    """
    if kc == 1:
        c = 256 if modes >= 32 else 128
        return max(1, length if length <= 2 * c else c)
    c = 128 if modes >= 32 and length > 8192 else 64
    return max(1, min(c, length))


def _toeplitz(k: Float[Array, "kc c"]) -> Float[Array, "kc c c"]:
    """Lower-triangular Toeplitz matrices `T[:, i, j] = k[:, i - j]` (`0` for `i < j`).

    Built by tiling and reshaping, not by a gather: row `i` of a `(c, 2c - 1)` view of
    `c` copies of `[k reversed, 0 ... 0]` (rotated) starts `i` places earlier than row
    `i - 1`. The gradient is then a sum, not a scatter-add.
    """
    kc, c = k.shape
    r = jnp.roll(jnp.concatenate([k[:, ::-1], jnp.zeros_like(k)], axis=1), 1 - c, axis=1)
    return jnp.tile(r, (1, c))[:, : c * (2 * c - 1)].reshape(kc, c, 2 * c - 1)[:, :, :c]


def _select(reverse: bool | Array, anti_causal: Array, causal: Array) -> Array:
    """`anti_causal if reverse else causal`, for a Python or a traced boolean."""
    if isinstance(reverse, bool):
        return anti_causal if reverse else causal
    return jnp.where(reverse, anti_causal, causal)


def chunked_conv(
    u: Float[Array | np.ndarray, "length channels"],
    abar: Complex[Array | np.ndarray, "kc modes"],
    cb: Complex[Array | np.ndarray, "kc modes"],
    skip: Float[Array | np.ndarray, " kc"] | None = None,
    *,
    reverse: bool | Bool[Array, ""] = False,
    chunk: IntLike | None = None,
) -> Float[Array, "length channels"]:
    """Convolve each channel with a diagonal-SSM kernel, exactly, by chunks.

    With the kernel `K[c, l] = 2 Re(sum_n CB[c, n] Abar[c, n]^l)` (as returned by
    [`lineax_seq.S4DKernel.discretize`][]) and an optional skip `D` folded into lag 0:

    - causal (`reverse=False`): `y[t, c] = sum_{s <= t} K[c, t - s] u[s, c] + D[c] u[t, c]`;
    - anti-causal (`reverse=True`): `y[t, c] = sum_{s >= t} K[c, s - t] u[s, c] + D[c] u[t, c]`.

    The same numbers as [`lineax_seq.fft_conv`][] with `K` (for `reverse=True`, of the
    time-reversed input), but computed from the SSM itself in chunks of `C` positions,
    as matrix products (which CPUs, and accelerators, run much faster than FFTs):

    1. within each chunk, a `(C, C)` Toeplitz product with the kernel's first `C` lags;
    2. each chunk's end state `S_q = sum_j Abar^(C-1-j) u[qC + j]` (causal): a
        `(modes, C)` product, real and imaginary parts stacked;
    3. the states carried across chunks, `H_q = Abar^C H_(q-1) + S_q`: a
        [`lineax_seq.linear_scan`][] over the `L / C` chunks;
    4. the carried state's effect on offset `i` of the next chunk,
        `2 Re(sum_n CB_n Abar_n^(i+1) H_n)`: a `(C, modes)` product.

    About `2 C + 8 modes` flops per position and channel, and `O(C + modes)` complex
    exponentials per mode in all: the length-`L` kernel is never formed. The
    anti-causal direction mirrors every step (no array is flipped). Lengths need not be
    a multiple of `C` (the last chunk is zero-padded). A non-finite input spoils every
    output of its chunk, the earlier ones included (`0 * inf` in the Toeplitz product).

    "Exactly" is the maths: no term is truncated. The powers `Abar^l` inherit `abar`'s
    rounding, so `(abar, cb)` from [`lineax_seq.S4DKernel.discretize`][] in float32
    with small steps (`|dt A|` near `1e-4`) give outputs about `1e-5` off (relative;
    `4e-5` to `7e-5` at 8,192 positions) where `fft_conv` with the kernel, whose powers
    come from `dt A` itself, is about `1e-6` off; the [`lineax_seq.S4D`][] layer hands
    `dt A` to the same computation and keeps the kernel's accuracy. A mode with
    `abar == 0` exactly (`exp(dt A)` underflowed, or the bilinear map of `dt A = -2`)
    contributes at lag 0 only, and its gradient with respect to `abar` is 0 (`log 0`
    has none), not the lag-1 term's 1.

    **Arguments:**

    - `u`: input of shape `(length, channels)`, any float dtype (computed in at least
        float32; returned in `u`'s dtype). `u`, `abar`, `cb` and `skip` are JAX or NumPy
        arrays.
    - `abar`, `cb`: the discrete systems, complex, of shape `(kc, modes)`, `kc` either
        `channels` (one SSM per channel) or `1` (one SSM shared by all channels).
    - `skip`: optional `D` of shape `(kc,)`, added at lag 0.
    - `reverse`: anti-causal instead of causal; a Python bool or a scalar boolean array
        (so that directions can be batched with `jax.vmap`).
    - `chunk`: chunk size `C`, a positive integer. Default: for a shared system 256
        (32 modes or more) or 128, and one chunk up to twice that; per channel 64, or
        128 for 32 modes or more beyond 8,192 positions. `C >= length` means one dense
        Toeplitz product.

    **Returns:**

    The output, of shape `(length, channels)`, in `u`'s dtype.
    """
    u, abar, cb = as_array("u", u), as_array("abar", abar), as_array("cb", cb)
    skip = as_array("skip", skip, optional=True)
    if u.ndim != 2:
        raise ValueError(f"u must have shape (length, channels), got u.shape={u.shape}")
    if not jnp.issubdtype(u.dtype, jnp.floating):
        raise TypeError(f"u must have a floating dtype, got u.dtype={u.dtype}")
    channels = u.shape[1]
    if abar.ndim != 2 or abar.shape[0] not in (1, channels):
        raise ValueError(
            f"abar must have shape (kc, modes) with kc = 1 or channels={channels}, "
            f"got abar.shape={abar.shape}"
        )
    if cb.shape != abar.shape:
        raise ValueError(f"cb must have the shape of abar={abar.shape}, got cb.shape={cb.shape}")
    kc = abar.shape[0]
    if skip is not None and skip.shape != (kc,):
        raise ValueError(f"skip must have shape ({kc},), got skip.shape={skip.shape}")
    check_float_dtype("skip", skip)
    if chunk is not None:
        chunk = check_int("chunk", chunk)
    if not isinstance(reverse, bool) and (
        not isinstance(reverse, jax.Array | np.ndarray | np.bool_)
        or jnp.shape(reverse) != ()
        or jnp.result_type(reverse) != jnp.bool_
    ):
        raise TypeError(
            f"reverse must be a Python bool or a scalar boolean array, got reverse={reverse!r}"
        )
    log_abar = _log_abar(abar.astype(_complex_dtype(u.dtype)))
    return _chunked_conv(u, log_abar, cb, skip, reverse=reverse, chunk=chunk)


def _log_abar(abar: Complex[Array, "*shape"]) -> Complex[Array, "*shape"]:
    """`log Abar`, finite where `Abar = 0`.

    `Abar = 0` (`exp(dt A)` underflowed, or the bilinear map of `dt A = -2`) is a valid
    system, but `log 0 = -inf` gives `Abar^0 = exp(-inf * 0) = nan`; the stand-in `LOG_ZERO`
    keeps `Abar^0 = 1` and `Abar^l = 0` for `l >= 1`.
    """
    zero = abar == 0
    return jnp.where(zero, LOG_ZERO, jnp.log(jnp.where(zero, 1, abar)))


def _complex_dtype(dtype) -> type:
    return jnp.complex128 if work_dtype(dtype) == jnp.float64 else jnp.complex64


def _chunked_conv(
    u: Float[Array, "length channels"],
    log_abar: Complex[Array, "kc modes"],
    cb: Complex[Array, "kc modes"],
    skip: Float[Array, " kc"] | None = None,
    *,
    reverse: bool | Bool[Array, ""] = False,
    chunk: IntLike | None = None,
) -> Float[Array, "length channels"]:
    """`chunked_conv` from `log Abar` (unchecked): for systems known by their log, as
    [`lineax_seq.S4DKernel`][]'s `dt A`, which `log(exp(dt A))` would round (in float32
    by about `1e-7 / |dt Re A|` relative, 1e-3 at `dt Re A = -1e-4`)."""
    length, channels = u.shape
    kc, modes = log_abar.shape
    c = _default_chunk(length, kc, modes) if chunk is None else min(chunk, length)
    q = -(-length // c)
    dtype = u.dtype
    work = work_dtype(dtype)
    cdtype = _complex_dtype(dtype)
    log_abar = log_abar.astype(cdtype)[:, :, None]
    cb = cb.astype(cdtype)
    x = jnp.pad(u.astype(work), ((0, q * c - length), (0, 0))).reshape(q, c, channels)

    def powers(e):  # Abar^e for integer exponents e: (m,) -> (kc, n, m)
        return jnp.exp(log_abar * e.astype(work).astype(cdtype))

    def apply(w, z, shared, per_channel):  # a real product per channel, or shared
        if kc == 1:
            return _isolated_einsum(shared, w[0], z)
        return _isolated_einsum(per_channel, w, z)

    o = jnp.arange(c)
    # 1. Within chunks: the kernel's first C lags (skip at lag 0), as Toeplitz matrices.
    k = 2 * jnp.einsum("kn,knl->kl", cb, powers(o), precision=_HIGHEST).real
    if skip is not None:
        k = k.at[:, 0].add(skip.astype(work))
    toeplitz = _toeplitz(k)  # (kc, C, C)
    toeplitz = _select(reverse, jnp.swapaxes(toeplitz, 1, 2), toeplitz)
    y = apply(toeplitz, x, "ij,qjc->qic", "cij,qjc->qic")
    if q > 1:
        # 2. Chunk states (real; imaginary): causal sum_j Abar^(C-1-j) u_j (after the
        # chunk), anti-causal sum_j Abar^j u_j (before it, seen from the right).
        w_in = powers(_select(reverse, o, c - 1 - o))  # (kc, n, C)
        w_in = jnp.concatenate([w_in.real, w_in.imag], axis=1)
        s = apply(w_in, x, "nj,qjc->qnc", "cnj,qjc->qnc")  # (Q, 2n, channels)
        s = jax.lax.complex(s[:, :modes], s[:, modes:])
        # 3. Carried states, H_q = Abar^C H_(q -+ 1) + S_q, in the direction of time
        # (anti-causal: the chunk order reversed), and the state entering each chunk.
        s = _select(reverse, s[::-1], s)
        a_c = jnp.broadcast_to(jnp.exp(c * log_abar[:, :, 0]).T, (q, modes, channels))
        h = linear_scan(a_c.reshape(q, -1), s.reshape(q, -1)).reshape(q, modes, channels)
        h = jnp.concatenate([jnp.zeros_like(h[:1]), h[:-1]])
        h = _select(reverse, h[::-1], h)
        # 4. Effect on offset i: 2 Re(sum_n CB_n Abar_n^e H_n), e = i + 1 (causal) or
        # C - i (anti-causal), as [2 Re V, -2 Im V] . [Re H, Im H].
        v = cb[:, :, None] * powers(_select(reverse, c - o, o + 1))  # (kc, n, C)
        w_out = 2 * jnp.concatenate([v.real, -v.imag], axis=1)  # (kc, 2n, C)
        h = jnp.concatenate([h.real, h.imag], axis=1)  # (Q, 2n, channels)
        y = y + apply(w_out, h, "ni,qnc->qic", "cni,qnc->qic")
    return y.reshape(q * c, channels)[:length].astype(dtype)
