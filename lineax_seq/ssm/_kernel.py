"""Diagonal state-space (S4D) convolution kernels."""

import functools
import math
import numbers

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Complex, Float, PRNGKeyArray

from .._checks import IntLike, RealScalar, check_choice, check_int, check_key, check_real
from .._numerics import work_dtype

_INITS = ("lin", "inv", "real", "legs")
_DISCRETIZATIONS = ("zoh", "bilinear")


LOG_ZERO = -1e4
"""The stand-in for `log Abar` where `Abar = 0`: `exp(LOG_ZERO * l)` is 1 at `l = 0` and
0 for `l >= 1`, where `log 0 = -inf` would give `exp(-inf * 0) = nan`."""


def _legs(state_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`(w, b)` of S4D-LegS: the positive imaginary parts `w` of the eigenvalues of the
    normal HiPPO-LegS matrix, in ascending order, and the S4D paper's `B`: HiPPO-LegS's
    `B` in the eigenbasis, halved.

    The normal part of HiPPO-LegS is `-1/2 I + S`, with `S` skew-symmetric,
    `S[n, k] = -sqrt(2n + 1) sqrt(2k + 1) / 2` for `n > k` (and `-S[k, n]` above the
    diagonal), and HiPPO-LegS's `B[n] = sqrt(2n + 1)`. The eigenvalues are `-1/2 + i w`
    in conjugate pairs, with eigenvectors `V`; one mode per pair is kept, with
    `b = |(V* B)[n]| / 2`. The phase of `V* B` is dropped: `C` starts circularly
    symmetric, so the initial kernel has the same distribution for any phase.
    """
    q = np.sqrt(2.0 * np.arange(state_size) + 1.0)
    lower = np.tril(np.outer(q, q), k=-1) / 2
    skew = lower.T - lower
    # `i S` is Hermitian: its real eigenvalues `v` give the eigenvalues `-i v` of `S`.
    v, vectors = np.linalg.eigh(1j * skew)
    keep = v < 0
    w, b = -v[keep], np.abs(vectors[:, keep].conj().T @ q) / 2
    order = np.argsort(w)
    return w[order], b[order]


def _init_ab(init: str, state_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(Re A, Im A, B)` of the `N/2` modes for one channel, as float64 numpy arrays."""
    modes = state_size // 2
    n = np.arange(modes, dtype=np.float64)
    half, ones = np.full(modes, -0.5), np.ones(modes)
    if init == "lin":
        return half, np.pi * n, ones
    if init == "inv":
        return half, (state_size / np.pi) * (state_size / (2 * n + 1) - 1), ones
    if init == "real":
        return -(n + 1), np.zeros(modes), ones
    return half, *_legs(state_size)


def _block_size(length: int) -> int:
    """Power of two near `sqrt(length)` (at least 16): the inner block of the powers."""
    return max(16, 1 << math.ceil(math.log2(max(length, 1)) / 2))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _random_init(
    key: PRNGKeyArray, channels: int, modes: int, log_dt_min: float, log_dt_max: float
) -> tuple[
    Float[Array, "channels modes"], Float[Array, "channels modes"], Float[Array, " channels"]
]:
    """`(Re C, Im C, log dt)`: C complex normal (variance 1/2 per part), log dt uniform."""
    c_key, dt_key = jr.split(key)
    c = jr.normal(c_key, (2, channels, modes)) * math.sqrt(0.5)
    log_dt = jr.uniform(dt_key, (channels,), minval=log_dt_min, maxval=log_dt_max)
    return c[0], c[1], log_dt


def check_kernel_options(
    state_size: IntLike,
    init: str,
    discretization: str,
    dt_min: RealScalar,
    dt_max: RealScalar,
    *,
    init_name: str = "init",
) -> tuple[float, float]:
    """`(dt_min, dt_max)` as floats, or a `ValueError` naming the argument unless the
    `S4DKernel` options are valid."""
    integer = isinstance(state_size, numbers.Integral) and not isinstance(state_size, bool)
    if not integer or state_size < 2 or state_size % 2:
        raise ValueError(
            f"state_size must be a positive even integer (N/2 complex modes are "
            f"stored), got state_size={state_size!r}"
        )
    check_choice(init_name, init, _INITS)
    check_choice("discretization", discretization, _DISCRETIZATIONS)
    dt_min, dt_max = check_real("dt_min", dt_min), check_real("dt_max", dt_max)
    if not dt_min < dt_max:
        raise ValueError(
            f"need 0 < dt_min < dt_max, got dt_min={dt_min!r}, dt_max={dt_max!r} "
            "(the initial steps are log-uniform in [dt_min, dt_max]: with a larger dt_min, "
            "pass a larger dt_max too)"
        )
    return dt_min, dt_max


def complex_(
    real: Float[Array, "*shape"], imag: Float[Array, "*shape"]
) -> Complex[Array, "*shape"]:
    """`real + i imag` in complex64, or complex128 if both parts are float64 (half-precision
    parameters, e.g. of a model cast to bfloat16, are computed in float32)."""
    work = work_dtype(jnp.result_type(real, imag))
    return jax.lax.complex(real.astype(work), imag.astype(work))


def _expm1_over(x: Complex[Array, "*shape"]) -> Complex[Array, "*shape"]:
    """`(exp(x) - 1) / x`, also where `x` is zero or too small to square: `1 + x / 2`
    below `sqrt(eps)`, which is exact to rounding there, and so is its gradient (the
    quotient's gradient divides by `x^2`, which underflows)."""
    small = jnp.abs(x) < jnp.sqrt(jnp.finfo(x.dtype).eps)
    safe = jnp.where(small, 1, x)
    return jnp.where(small, 1 + x / 2, jnp.expm1(safe) / safe)


class S4DKernel(eqx.Module):
    """Diagonal state-space (S4D) convolution kernel.

    Each of `channels` independent SSMs has a diagonal continuous-time state matrix
    `A` with `modes = state_size / 2` eigenvalues (one per conjugate pair), input
    vector `B`, output vector `C` and step size `dt`. After discretisation
    (`Abar`, `Bbar`) the length-`L` convolution kernel is

    `K[c, l] = 2 Re( sum_n C[c, n] Bbar[c, n] Abar[c, n]^l )`, `l = 0, ..., L - 1`,

    so that `y = K * u` is the output of `x_l = Abar x_{l-1} + Bbar u_l`,
    `y_l = 2 Re(C x_l)` (the conjugate half of the state is implicit).

    Initialisations of `A` (S4D paper): `"lin"` `A_n = -1/2 + i pi n`; `"inv"`
    `A_n = -1/2 + i (N/pi) (N/(2n+1) - 1)`; `"real"` `A_n = -(n+1)`; `"legs"` the
    eigenvalues of the normal part of HiPPO-LegS (`-1/2 + i w_n`). `B` starts at ones,
    except for `"legs"`: the S4D paper's S4D-LegS `B`, HiPPO-LegS's `B` in the
    eigenbasis and halved, `|V* B| / 2` (real: the phase is dropped, which leaves the
    initial kernel's distribution unchanged). `C` is complex normal
    (variance 1/2 per part), `log dt` is uniform in `[log dt_min, log dt_max]` per
    channel.

    All parameters are real arrays: `Re A = -exp(log_neg_real_a)` stays negative
    (a stable system) under any optimiser, or reaches 0 where the exponential
    underflows (`log_neg_real_a` below about -87 in float32), where zero-order hold
    takes its limit `Bbar = dt B`; `B`, `C` are stored as real and imaginary parts.

    The kernel can be evaluated at any length at call time. It is computed by powers
    in blocks: with `L = M * P`, `Abar^(P m + j) = Abar^(P m) Abar^j` needs only
    `M + P` complex exponentials per mode, and the sum over modes is a real matrix
    product, so no `(channels, modes, length)` complex array is ever formed.
    """

    log_neg_real_a: Float[Array, "channels modes"]
    imag_a: Float[Array, "channels modes"]
    b_real: Float[Array, "channels modes"]
    b_imag: Float[Array, "channels modes"]
    c_real: Float[Array, "channels modes"]
    c_imag: Float[Array, "channels modes"]
    log_dt: Float[Array, " channels"]
    state_size: int = eqx.field(static=True)
    channels: int = eqx.field(static=True)
    init: str = eqx.field(static=True)
    discretization: str = eqx.field(static=True)

    def __init__(
        self,
        state_size: IntLike = 64,
        channels: IntLike = 1,
        *,
        init: str = "lin",
        discretization: str = "zoh",
        dt_min: RealScalar = 1e-3,
        dt_max: RealScalar = 1e-1,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `state_size`: the state size `N` (even; `N/2` complex modes are stored).
        - `channels`: number of independent kernels (`1` for one kernel shared by all
            features, as BiGS does; `dim` for one per feature, as S4D layers usually do).
        - `init`: initialisation of `A`: `"lin"`, `"inv"`, `"real"` or `"legs"`.
        - `discretization`: `"zoh"` (zero-order hold) or `"bilinear"`.
        - `dt_min`, `dt_max`: range of the log-uniform initial step size,
            `0 < dt_min < dt_max`.
        - `key`: a `jax.random.key` for `C` and `dt`.
        """
        check_key("key", key)
        dt_min, dt_max = check_kernel_options(state_size, init, discretization, dt_min, dt_max)
        state_size = int(state_size)
        channels = check_int("channels", channels)
        modes = state_size // 2
        real_a, imag_a, b = _init_ab(init, state_size)
        shape = (channels, modes)
        # Deterministic parts from NumPy (no XLA compilation); random parts in one jit.
        # All in JAX's default float dtype (float64 under `jax_enable_x64`), like C, dt.
        dtype = jax.dtypes.canonicalize_dtype(jnp.float64)
        self.log_neg_real_a = jnp.asarray(np.broadcast_to(np.log(-real_a), shape), dtype)
        self.imag_a = jnp.asarray(np.broadcast_to(imag_a, shape), dtype)
        self.b_real = jnp.asarray(np.broadcast_to(b, shape), dtype)
        self.b_imag = jnp.asarray(np.zeros(shape), dtype)
        self.c_real, self.c_imag, self.log_dt = _random_init(
            key, channels, modes, math.log(dt_min), math.log(dt_max)
        )
        self.state_size = state_size
        self.channels = channels
        self.init = init
        self.discretization = discretization

    def _discretize(
        self,
    ) -> tuple[Complex[Array, "channels modes"], Complex[Array, "channels modes"]]:
        """`(log Abar, C Bbar)`: `Abar^l = exp(l log Abar)` is exact in `l`."""
        a = complex_(-jnp.exp(self.log_neg_real_a), self.imag_a)
        b = complex_(self.b_real, self.b_imag)
        c = complex_(self.c_real, self.c_imag)
        dt = jnp.exp(self.log_dt)[:, None].astype(a.dtype)
        dta = dt * a
        if self.discretization == "zoh":
            log_abar = dta
            bbar = dt * _expm1_over(dta) * b
        else:
            half = dta / 2
            # log((1 + h) / (1 - h)) without rounding the quotient (1 + O(dt)) first.
            # Its real part, log |1 + h| - log |1 - h|, cancels where |h| >> 1 (|Abar|
            # near 1 again): it is log1p(4 Re h / |1 - h|^2) / 2, exactly.
            # dt A = -2 maps to Abar = 0 (`LOG_ZERO`).
            zero = half == -1
            safe = jnp.where(zero, 0, half)
            decay = jnp.log1p(4 * safe.real / jnp.abs(1 - safe) ** 2) / 2
            turn = jnp.angle(1 + safe) - jnp.angle(1 - safe)
            log_abar = jnp.where(zero, LOG_ZERO, complex_(decay, turn))
            bbar = dt * b / (1 - half)
        return log_abar, c * bbar

    def discretize(
        self,
    ) -> tuple[Complex[Array, "channels modes"], Complex[Array, "channels modes"]]:
        """The discrete system.

        **Returns:**

        `(Abar, CB)`, both complex of shape `(channels, modes)`, with
        `CB = C * Bbar`, so that `K[c, l] = 2 Re(sum_n CB[c, n] * Abar[c, n] ** l)` and
        the recurrence `x_l = Abar x_{l-1} + u_l`, `y_l = 2 Re(sum_n CB x_l)` reproduces
        the convolution.
        """
        log_abar, cb = self._discretize()
        return jnp.exp(log_abar), cb

    def __call__(self, length: IntLike) -> Float[Array, "channels length"]:
        """Evaluate the kernel.

        **Arguments:**

        - `length`: kernel length `L` (any positive integer, fixed at trace time).

        **Returns:**

        The real kernel `K`, of shape `(channels, length)`: float32 (float64 for float64
        parameters), also for half-precision parameters, whose powers `Abar^l` are
        computed in float32. The parameters themselves are not: cast to bfloat16, `log_dt`
        and `imag_a` are rounded, and the phase error grows with `l` (over 10% of the
        kernel by `l = 100`, mostly from `log_dt`); keep the kernel's leaves float32
        under mixed precision.
        """
        length = check_int("length", length)
        log_abar, cb = self._discretize()
        block = min(_block_size(length), length)
        num_blocks = -(-length // block)
        j = jnp.arange(block, dtype=jnp.float32)
        m = jnp.arange(num_blocks, dtype=jnp.float32) * block
        cdtype = log_abar.dtype
        # Abar^j for the inner block (channels, modes, P); (C Bbar) Abar^(P m) for the
        # outer one (channels, M, modes). Both from exp of the exact log: no error growth.
        inner = jnp.exp(log_abar[:, :, None] * j.astype(cdtype))
        outer = cb[:, None, :] * jnp.exp(log_abar[:, None, :] * m[:, None].astype(cdtype))
        # 2 Re(outer @ inner) as one real batched matmul over [real; imag] modes.
        lhs = jnp.concatenate([outer.real, -outer.imag], axis=-1)
        rhs = jnp.concatenate([inner.real, inner.imag], axis=1)
        k = 2 * jnp.einsum("cmn,cnj->cmj", lhs, rhs, precision=jax.lax.Precision.HIGHEST)
        return k.reshape(self.channels, num_blocks * block)[:, :length]


def zero_state(kernel: S4DKernel, channels: int) -> Complex[Array, "channels modes"]:
    """The zero state of `channels` recurrences driven by `kernel`'s modes."""
    dtype = complex_(kernel.c_real, kernel.c_imag).dtype
    return jnp.zeros((channels, kernel.state_size // 2), dtype)


def recurrence_step(
    kernel: S4DKernel,
    state: Complex[Array, "channels modes"],
    u: Float[Array, " channels"],
) -> tuple[Complex[Array, "channels modes"], Float[Array, " channels"]]:
    """One step of the recurrence whose impulse response is `kernel`'s (no skip):
    `state' = Abar state + u`, `y = 2 Re(sum_n CB state')`. Returns `(state', y)`, the
    new state in `state`'s dtype (a scan's carry keeps its type)."""
    abar, cb = kernel.discretize()
    new = abar * state + u.astype(abar.dtype)[:, None]
    return new.astype(state.dtype), 2 * jnp.sum((cb * new).real, axis=-1)
