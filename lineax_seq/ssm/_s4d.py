"""The S4D layer: diagonal SSM convolution + skip, with a recurrent mode."""

import functools
from collections.abc import Callable
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from beartype import beartype
from jaxtyping import Array, Complex, Float, PRNGKeyArray, jaxtyped

from .._checks import (
    IntLike,
    RealScalar,
    check_bool,
    check_choice,
    check_float_dtype,
    check_int,
    check_key,
)
from .._numerics import work_dtype
from ._chunked import _chunked_conv
from ._fft_conv import fft_conv
from ._kernel import S4DKernel, recurrence_step, zero_state

_CONVS = ("auto", "fft", "chunked")


class S4D(eqx.Module):
    """S4D layer: a diagonal SSM per feature, run as a long convolution.

    `y = act(K * x + D x)`, then optionally a gated linear unit
    `glu(W y + b)` (`W: dim -> 2 dim`), as in the S4/S4D blocks. With the defaults
    (`activation=None`, `glu=False`) the layer is linear in `x`.

    `K` is an [`lineax_seq.S4DKernel`][] with `channels` kernels: `channels=dim`
    gives every feature its own SSM, `channels=1` shares one kernel across all features
    (as BiGS does). With `bidirectional=True` a second kernel runs backwards in time
    over the strictly-future inputs (see [`lineax_seq.fft_conv`][] for the lag
    convention).

    The convolution is computed exactly either way, by one of two methods (`conv`):
    `"fft"`, [`lineax_seq.fft_conv`][] with the kernel generated at the input's length;
    or `"chunked"`, [`lineax_seq.chunked_conv`][], matrix products within chunks and
    the SSM state carried between them (no FFT, no length-`L` kernel). `"auto"` (the
    default) picks `"chunked"` for a shared kernel (`channels=1 < dim`, where the in-chunk
    Toeplitz matrix is one GEMM for all features: 1.5-1.8x faster than the FFT on CPU
    at 1k-64k positions) and `"fft"` for per-channel kernels (there the chunked
    method's `2 C + 8 modes` flops per position and feature, in small per-channel
    GEMMs, were 1.3-2.5x slower than XLA's FFT on CPU at `state_size=64`; both in
    `benchmarks/results/ssm.json`). On a GPU the FFT is memory-bound at long lengths:
    on an H100 the per-channel chunked forward was 1.3x faster at 16k positions and
    2.2x at 64k (`ssm_gpu.json`), so there pass `conv="chunked"` for long sequences.

    Causal layers also run recurrently, one step at a time, via
    [`lineax_seq.S4D.init_state`][] and [`lineax_seq.S4D.step`][]; this reproduces
    `__call__` exactly (up to float rounding), e.g. for autoregressive generation.
    """

    kernel: S4DKernel
    kernel_backward: S4DKernel | None
    skip: Float[Array, " dim"]
    glu: eqx.nn.Linear | None
    activation: Callable[[Array], Array] | None
    dim: int = eqx.field(static=True)
    bidirectional: bool = eqx.field(static=True)
    conv: str = eqx.field(static=True)

    def __init__(
        self,
        dim: IntLike,
        *,
        state_size: IntLike = 64,
        channels: IntLike | None = None,
        bidirectional: bool = False,
        init: str = "lin",
        discretization: str = "zoh",
        dt_min: RealScalar = 1e-3,
        dt_max: RealScalar = 1e-1,
        activation: Callable[[Array], Array] | None = None,
        glu: bool = False,
        conv: Literal["auto", "fft", "chunked"] = "auto",
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: number of features of the input and output.
        - `state_size`: SSM state size `N` (even).
        - `channels`: number of kernels, `dim` (default, one per feature) or `1` (shared).
        - `bidirectional`: add a backward kernel (no recurrent mode then).
        - `init`, `discretization`, `dt_min`, `dt_max`: passed to
            [`lineax_seq.S4DKernel`][].
        - `activation`: optional elementwise function applied after the skip, e.g.
            `jax.nn.gelu`, or a module with parameters such as `eqx.nn.PReLU()` (a
            field like `eqx.nn.MLP`'s, so its parameters are trained and saved).
        - `glu`: add an output linear map `dim -> 2 dim` followed by `jax.nn.glu`.
        - `conv`: how the convolution is computed: `"fft"`, `"chunked"` or `"auto"`
            (`"chunked"` for a kernel shared by several features, `channels=1 < dim`,
            else `"fft"`); all exact, same parameters.
        - `key`: a `jax.random.key`.
        """
        check_key("key", key)
        dim = check_int("dim", dim)
        check_bool("bidirectional", bidirectional)
        check_bool("glu", glu)
        if activation is not None and not callable(activation):
            raise TypeError(f"activation must be a callable or None, got activation={activation!r}")
        channels = dim if channels is None else channels
        if channels not in (1, dim):
            raise ValueError(f"channels must be 1 or dim={dim}, got channels={channels!r}")
        check_choice("conv", conv, _CONVS)
        k_key, kb_key, d_key, g_key = jr.split(key, 4)
        kernel = functools.partial(
            S4DKernel,
            state_size,
            channels,
            init=init,
            discretization=discretization,
            dt_min=dt_min,
            dt_max=dt_max,
        )
        self.kernel = kernel(key=k_key)
        self.kernel_backward = kernel(key=kb_key) if bidirectional else None
        self.skip = jr.normal(d_key, (dim,))
        self.glu = eqx.nn.Linear(dim, 2 * dim, key=g_key) if glu else None
        self.dim = dim
        self.bidirectional = bidirectional
        self.activation = activation
        self.conv = conv

    def _check_input(self, name: str, x: Array, *, sequence: bool) -> None:
        """A `TypeError` unless `x` is real floating (an integer input would come back
        rounded), a `ValueError` unless it is `(length >= 1, dim)` (`sequence`) or
        `(dim,)`: checked here too, for calls with jaxtyping's checks off."""
        check_float_dtype(name, x)
        shape = "(length, dim)" if sequence else "(dim,)"
        if x.ndim != (2 if sequence else 1):
            raise ValueError(f"{name} must have shape {shape}, got {name}.shape={x.shape}")
        if x.shape[-1] != self.dim:
            raise ValueError(f"{name} must have dim={self.dim} features, got {x.shape[-1]}")
        if sequence and x.shape[0] < 1:
            raise ValueError(f"{name} must have at least one position, got {name}.shape={x.shape}")

    def _output(self, y: Float[Array, "*length dim"]) -> Float[Array, "*length dim"]:
        # In `y`'s (work) dtype; the GLU's product runs in its parameters' dtype.
        dtype = y.dtype
        if self.activation is not None:
            y = self.activation(y)
        if self.glu is not None:
            linear = self.glu if y.ndim == 1 else jax.vmap(self.glu)
            y = jax.nn.glu(linear(y.astype(self.glu.weight.dtype)), axis=-1)
        return y.astype(dtype)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self, x: Float[Array | np.ndarray, "length dim"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "length dim"]:
        """Apply the layer to a whole sequence (convolution mode).

        **Arguments:**

        - `x`: input sequence of shape `(length, dim)`, any length.
        - `key`: ignored (the layer is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        The output sequence, of shape `(length, dim)`, in `x`'s dtype (bfloat16 and
        float16 are computed in float32 and rounded once).
        """
        x = jnp.asarray(x)
        self._check_input("x", x, sequence=True)
        dtype = x.dtype
        # Half precision is computed in float32 and rounded once, the skip included.
        x = x.astype(work_dtype(dtype))
        shared = self.kernel.channels != self.dim
        method = self.conv if self.conv != "auto" else ("chunked" if shared else "fft")
        # Per-channel kernels take the skip at lag 0: one convolution gives K * x + D x.
        skip = None if shared else self.skip
        if method == "chunked":
            y = _chunked_conv(x, *self.kernel._discretize(), skip)
            if self.kernel_backward is not None:
                # Lags -1, -2, ...: the anti-causal convolution of x shifted by one.
                future = jnp.concatenate([x[1:], jnp.zeros_like(x[:1])])
                y = y + _chunked_conv(future, *self.kernel_backward._discretize(), reverse=True)
        else:
            length = x.shape[0]
            k = self.kernel(length)
            k = k if skip is None else k.at[:, 0].add(skip.astype(k.dtype))
            k_backward = None if self.kernel_backward is None else self.kernel_backward(length)
            y = fft_conv(x, k, k_backward)
        if shared:
            y = y + self.skip.astype(x.dtype) * x
        return self._output(y).astype(dtype)

    def init_state(self) -> Complex[Array, "dim modes"]:
        """The zero recurrent state (before the first input).

        **Returns:**

        A complex array of shape `(dim, state_size // 2)`.
        """
        if self.bidirectional:
            raise ValueError(
                "bidirectional=True S4D layers have no recurrent mode (the backward kernel "
                "needs the future inputs)"
            )
        return zero_state(self.kernel, self.dim)

    @jaxtyped(typechecker=beartype)
    def step(
        self,
        state: Complex[Array | np.ndarray, "dim modes"],
        x_t: Float[Array | np.ndarray, " dim"],
    ) -> tuple[Complex[Array, "dim modes"], Float[Array, " dim"]]:
        """Advance the recurrence by one input (recurrent mode).

        `state_t = Abar state_{t-1} + x_t`, `y_t = 2 Re(sum_n CB state_t) + D x_t`, then
        the activation / GLU: iterating it from `init_state()` gives exactly
        `__call__` on the whole sequence. JAX hashes the functions given to
        `jax.lax.scan` and `jax.jit`, and a module's arrays are unhashable: pass a function,
        `jax.lax.scan(lambda s, x: layer.step(s, x), layer.init_state(), xs)`, or use
        `eqx.filter_jit(layer.step)`.

        **Arguments:**

        - `state`: the state from `init_state()` or the previous `step`, `(dim, modes)`.
        - `x_t`: the input at this step, of shape `(dim,)`.

        **Returns:**

        `(state, y_t)`: the new state, in `state`'s dtype (so it can be a scan's carry),
        and the output at this step, of shape `(dim,)`, in `x_t`'s dtype.
        """
        state, x_t = jnp.asarray(state), jnp.asarray(x_t)
        if self.bidirectional:
            raise ValueError(
                "bidirectional=True S4D layers have no recurrent mode (the backward kernel "
                "needs the future inputs)"
            )
        self._check_input("x_t", x_t, sequence=False)
        if not jnp.issubdtype(state.dtype, jnp.complexfloating):
            raise TypeError(
                f"state must be complex as from init_state(), got state.dtype={state.dtype}"
            )
        expected = (self.dim, self.kernel.state_size // 2)
        if state.shape != expected:
            raise ValueError(
                f"state must have shape (dim, state_size // 2)={expected} as from "
                f"init_state(), got state.shape={state.shape}"
            )
        state, y = recurrence_step(self.kernel, state, x_t)
        y = y + self.skip.astype(y.dtype) * x_t.astype(y.dtype)
        return state, self._output(y).astype(x_t.dtype)
