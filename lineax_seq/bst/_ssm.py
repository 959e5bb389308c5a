"""The SSM sublayer of a Block-State Transformer layer: project down, long conv, D skip."""

import functools
from collections.abc import Callable, Hashable
from typing import Literal, Protocol, cast, runtime_checkable

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from einops import rearrange, repeat
from jaxtyping import Array, Complex, Float, Int, PRNGKeyArray

from .._checks import (
    IntLike,
    RealScalar,
    as_array,
    check_choice,
    check_int,
    check_key,
    check_optional_int,
    fail_if,
    host_arrays,
)
from .._nn import apply_linear
from .._numerics import rfft_conv
from ..ssm import HyenaFilter, S4DKernel, linear_scan
from ..ssm._chunked import _chunked_conv, _isolated_einsum
from ..ssm._kernel import check_kernel_options, recurrence_step, zero_state

SSMS = ("s4", "unstruct")
Position = Int[Array | np.ndarray, ""] | IntLike


@runtime_checkable
class BoundInit(Protocol):
    """A bound `init_cache` / `init_state`: a Python bound method, or Equinox's for a
    module's method (which is not a `types.MethodType`)."""

    @property
    def __self__(self) -> object: ...

    @property
    def __func__(self) -> Callable[..., object]: ...

    def __call__(self, held: int, /) -> object: ...


def held_positions(cache: object) -> int | None:
    """The positions that a decoding cache (or state) holds: the length of its
    `"inputs"` (stored by `ssm="unstruct"`), or `None` if it has none (a fixed size)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0]:
        if path[-1:] == (jax.tree_util.DictKey("inputs"),) and len(getattr(leaf, "shape", ())) == 2:
            return leaf.shape[0]
    return None


def expected_cache(init: BoundInit, held: int) -> object:
    """`eqx.filter_eval_shape(init, held)`, traced once per module structure (its tree,
    static fields, array shapes and dtypes) and `held`: `step` checks its cache on every
    token, and tracing `init_cache` each time cost a 2-layer LM's step 9x its compute."""
    leaves, treedef = jax.tree.flatten(init.__self__)
    spec = tuple(
        jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
        if eqx.is_array(a)
        else a
        for a in leaves
    )
    x64 = jax.config.read("jax_enable_x64")
    try:
        return _abstract_cache(init.__func__, treedef, spec, held, x64)
    except TypeError:  # an unhashable non-array leaf: trace it every time
        return eqx.filter_eval_shape(init, held)


@functools.lru_cache(maxsize=64)
def _abstract_cache(init: Callable, treedef: Hashable, spec: tuple, held: int, x64: bool) -> object:
    del x64  # (a key: a cache's dtypes may depend on it)
    return eqx.filter_eval_shape(init, jax.tree.unflatten(treedef, spec), held)


def check_cache(name: str, cache: object, init: BoundInit, held: int | None) -> None:
    """A `ValueError` naming `name`, or its first wrong entry, unless `cache` has the
    entries, shapes and dtypes of `init(held)` (a bound `init_cache` / `init_state`; any
    length if `held` is `None`). Evaluated abstractly: nothing is computed, and traced
    caches are checked too."""
    flat = lambda tree: {
        f"{name}{jax.tree_util.keystr(path)}": leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
    want, got = flat(expected_cache(init, held or 1)), flat(cache)
    source = f"{type(init.__self__).__name__}.{init.__func__.__name__}"
    if want.keys() != got.keys():
        listed = lambda keys: ", ".join(keys[:3]) + (f" ({len(keys)} in all)" if keys[3:] else "")
        wrong = [
            f"{what} {listed(keys)}"
            for what, keys in [
                ("lacks", [k for k in want if k not in got]),
                ("has unexpected", [k for k in got if k not in want]),
            ]
            if keys
        ]
        raise ValueError(
            f"`{name}` must be a decoding state from {source} (or step), got one that "
            f"{' and '.join(wrong)}"
        )
    for key, spec in want.items():
        leaf = got[key]
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape != spec.shape or dtype != spec.dtype:
            value = f"{leaf!r}" if shape is None else f"shape {shape} and dtype {dtype}"
            hint = "cast it" if shape == spec.shape else "a state of another model?"
            raise ValueError(
                f"`{key}` must have shape {spec.shape} and dtype {spec.dtype}, as from "
                f"{source}, got {value} ({hint})"
            )


def check_position(name: str, t: Position | None, held: int | None = None) -> Int[Array, ""]:
    """`t` as an int32 scalar, or a `ValueError` naming it unless it is a scalar integer
    (Python, NumPy or JAX; not a bool) and, if concrete, a position in `[0, 2**31)`
    below `held` (the positions of an `ssm="unstruct"` decoding state, if not `None`).
    A traced `t`'s value is not checked here."""
    (array,) = host_arrays(t)
    if array is None or array.shape != () or not jnp.issubdtype(array.dtype, jnp.integer):
        got = "None" if array is None else f"{t!r} (shape {array.shape}, dtype {array.dtype})"
        raise ValueError(f"`{name}` must be a scalar integer position, got {name}={got}")
    if not isinstance(array, jax.core.Tracer) and getattr(array, "is_fully_addressable", True):
        value = int(array)
        if not 0 <= value < 2**31:
            raise ValueError(f"`{name}` must be a position in [0, 2**31), got {name}={value}")
        if held is not None and value >= held:
            raise ValueError(
                f"`{name}`={value} is past the end: the decoding state holds {held} positions "
                '(the max_length it was made for, as ssm="unstruct" layers store their '
                "inputs); decode no further, or start from a larger max_length"
            )
    return jnp.asarray(array, jnp.int32)


def check_features(name: str, x: object, dim: int | Literal["scalar"], ndim: int = 2) -> Array:
    """`x` as a JAX array (see `as_array`), or an error naming it unless it is a floating
    array of shape `(length, dim)` with `length >= 1` (`ndim=2`) or `(dim,)` (`ndim=1`)."""
    x = as_array(name, x)
    if x.ndim != ndim or x.shape[-1] != dim or (ndim == 2 and x.shape[0] < 1):
        length = " and length >= 1" if ndim == 2 else ""
        expected = f"{'(length, dim)' if ndim == 2 else '(dim,)'} with dim={dim}{length}"
        raise ValueError(f"`{name}` must have shape {expected}, got shape {x.shape}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"`{name}` must be a floating-point array, got dtype {x.dtype}.")
    return x


class ContextSSM(eqx.Module):
    """Long-range context sublayer of a BST layer.

    The input is projected down to `features` (the paper: `dim / 4`, and `dim / 8` for
    Multi-Filter), copied to `streams` streams (1 for SH, `num_heads` for MH, `S` filters
    for MF), and each of the `streams * features` channels is convolved over the whole
    sequence with its own kernel by FFT (as [`lineax_seq.fft_conv`][], but the down-projected
    input is transformed once and shared by all streams), plus a per-channel skip `D * u`
    (`skip`, starting at 1 for `"s4"`; the Hyena filter's own `bias` for `"unstruct"`).
    A single `"s4"` stream (SH) is convolved by [`lineax_seq.chunked_conv`][] instead:
    the same numbers, from matrix products.

    - `"s4"`: [`lineax_seq.S4DKernel`][] kernels, generated for the actual length, so the
      layer runs at any length and has an exact `O(N)` recurrent step mode.
    - `"unstruct"`: [`lineax_seq.HyenaFilter`][] implicit filters (the paper's eq. 2.3.4);
      no recurrence, so step mode is a direct convolution over the stored inputs
      (`O(max_length)` per token: a fixed-size buffer of `init_state`'s `max_length`).

    Channels are laid out stream-major: channel `s * features + f` is stream `s`,
    feature `f`.
    """

    down: eqx.nn.Linear
    kernel: S4DKernel | HyenaFilter
    skip: Float[Array, " channels"] | None
    streams: int = eqx.field(static=True)
    features: int = eqx.field(static=True)
    ssm: str = eqx.field(static=True)

    def __init__(
        self,
        dim: IntLike,
        features: IntLike,
        streams: IntLike,
        *,
        ssm: str = "s4",
        state_size: IntLike = 16,
        dt_min: RealScalar = 1e-3,
        dt_max: RealScalar = 1e-1,
        max_length: IntLike | None = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: input feature size.
        - `features`: size after the down projection.
        - `streams`: number of output streams (SH 1, MH heads, MF filters).
        - `ssm`: `"s4"` or `"unstruct"`.
        - `state_size`: S4D state size `N`, even (used by `"s4"` only, checked for both).
        - `dt_min`, `dt_max`: range of the S4D kernels' log-uniform initial step size
          (used by `"s4"` only, checked for both). The slowest mode's time constant is
          about `2 / dt_min` steps; for a model that must run longer than it was
          trained, keep it within the training length (e.g. `dt_min = 4 /
          train_length`), so that every mode settles during training.
        - `max_length`: the training length that Hyena positions are normalised by
          (required for `"unstruct"`; `None` or a positive integer for `"s4"`, unused).
        - `key`: PRNG key.
        """
        check_key("key", key)
        check_choice("ssm", ssm, SSMS)
        dim = check_int("dim", dim)
        features = check_int("features", features)
        streams = check_int("streams", streams)
        check_kernel_options(state_size, "lin", "zoh", dt_min, dt_max)
        max_length = check_optional_int("max_length", max_length)
        kd, kk = jr.split(key)
        channels = streams * features
        self.down = eqx.nn.Linear(dim, features, key=kd)
        if ssm == "s4":
            self.kernel = S4DKernel(state_size, channels, dt_min=dt_min, dt_max=dt_max, key=kk)
            self.skip = jnp.ones((channels,))
        else:
            if max_length is None:
                raise ValueError('`max_length` is required when ssm="unstruct".')
            self.kernel = HyenaFilter(channels, max_length=max_length, key=kk)
            self.skip = None
        self.streams = streams
        self.features = features
        self.ssm = ssm

    def _skip(self) -> Float[Array, " channels"]:
        return cast(HyenaFilter, self.kernel).bias if self.skip is None else self.skip

    def __call__(
        self, x: Float[Array | np.ndarray, "length dim"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "length streams features"]:
        """**Arguments:**

        - `x`: shape `(length, dim)`.
        - `key`: ignored (the layer is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        The SSM outputs, shape `(length, streams, features)`; position `t` depends on
        `x[: t + 1]` only.
        """
        x = check_features("x", x, self.down.in_features)
        length = x.shape[0]
        u = apply_linear(self.down, x)
        if isinstance(self.kernel, S4DKernel) and self.streams == 1:
            # One stream: no transform to share, and the chunked form (matrix products
            # and a scan over chunks, no FFT) is the faster exact convolution.
            return _chunked_conv(u, *self.kernel._discretize(), self._skip())[:, None, :]
        # Causal FFT convolution (exact); the streams share u, so its transform is
        # computed once (broadcast), not `streams` times.
        k = rearrange(self.kernel(length), "(s f) l -> s f l", s=self.streams)
        y = rearrange(rfft_conv(u[None], k), "s l f -> l s f")
        skip = rearrange(self._skip(), "(s f) -> s f", s=self.streams)
        return y + skip * u[:, None, :]

    def block_ends(
        self, x: Float[Array | np.ndarray, "length dim"], window: IntLike
    ) -> Float[Array, "blocks streams features"]:
        """The outputs at the last position of every block of `window` positions only,
        equal to `self(x)[window - 1 :: window]`.

        For `"s4"` they follow from the SSM states at the block ends, without the
        full-length convolution: with `s_t = Abar s_{t-1} + u_t` and
        `y_t = 2 Re(CB . s_t) + D u_t`, the state at the end of block `b` is
        `Abar^W s_(end of b-1) + sum_j Abar^(W-1-j) u_(bW+j)`. The block sums are real
        matrix products against the powers `Abar^(W-1-j)`; the carry over blocks is
        [`lineax_seq.linear_scan`][]. About `4 modes` flops per position and channel
        instead of an FFT. `"unstruct"` filters have no state: there it is the full
        convolution, sliced.

        **Arguments:**

        - `x`: shape `(length, dim)`, `length` a multiple of `window`.
        - `window`: the block size `W`.

        **Returns:**

        Shape `(length // window, streams, features)`.
        """
        x = check_features("x", x, self.down.in_features)
        length = x.shape[0]
        window = check_int("window", window)
        if length % window:
            raise ValueError(f"length={length} must be a multiple of window={window}")
        if not isinstance(self.kernel, S4DKernel):
            return self(x)[window - 1 :: window]
        u = apply_linear(self.down, x)  # (length, features)
        states, cb = self._end_states(self.kernel, u, window)  # (n, f, s, m)
        y = 2 * jnp.sum((cb * states).real, axis=-1)  # (n, f, s)
        skip = rearrange(self._skip(), "(s f) -> f s", s=self.streams)
        y = y + (skip * u[window - 1 :: window, :, None]).astype(y.dtype)
        return rearrange(y, "n f s -> n s f").astype(u.dtype)  # `self(x)`'s dtype

    def _end_states(
        self, kernel: S4DKernel, u: Float[Array, "length features"], window: int
    ) -> tuple[
        Complex[Array, "blocks features streams modes"], Complex[Array, "features streams modes"]
    ]:
        """`"s4"`: the recurrent states `s_t` at every block's last position, and `C Bbar`,
        from the down-projected input `u`."""
        # (channels, modes), channel = stream * f + feature
        log_abar, cb = kernel._discretize()
        split = lambda a: rearrange(a, "(s f) m -> f s m", s=self.streams)
        log_abar, cb = split(log_abar), split(cb)
        # In the kernel's dtype (float32 for a bfloat16 model, as the convolution works).
        blocks = rearrange(u, "(n w) f -> f n w", w=window).astype(log_abar.real.dtype)
        # Abar^e = exp(e log Abar), exact in e (repeated products would compound their
        # rounding), in real arithmetic: XLA's CPU complex exp is not vectorised.
        e = jnp.arange(window - 1, -1, -1, dtype=log_abar.real.dtype)[:, None, None, None]
        magnitude = jnp.exp(e * log_abar.real)
        power = [magnitude * jnp.cos(e * log_abar.imag), magnitude * jnp.sin(e * log_abar.imag)]
        power = [rearrange(p, "w f s m -> f w (s m)") for p in power]
        decay = jnp.exp(window * log_abar)
        # One real batched product (over features) per part: (n, W) @ (W, streams * modes).
        inflow = lambda part: _isolated_einsum("fnw,fwc->fnc", blocks, part)
        states = rearrange(jax.lax.complex(inflow(power[0]), inflow(power[1])), "f n c -> n (f c)")
        decay = jnp.broadcast_to(decay.reshape(-1), states.shape).astype(states.dtype)
        return linear_scan(decay, states).reshape(-1, *cb.shape), cb

    def _prefill_state(
        self, x: Float[Array, "length dim"], window: int, blocks: Int[Array, ""], max_length: int
    ) -> dict[str, Array]:
        """The `step` state after the first `blocks` blocks of `x` (`length` a multiple
        of `window`; later positions are ignored), as if stepped through them."""
        u = apply_linear(self.down, x)
        empty = self.init_state(max_length)
        if isinstance(self.kernel, S4DKernel):
            states, _ = self._end_states(self.kernel, u, window)
            last = rearrange(states[jnp.maximum(blocks - 1, 0)], "f s m -> (s f) m")
            return {"s4": jnp.where(blocks > 0, last, 0).astype(empty["s4"].dtype)}
        rows = min(u.shape[0], max_length)
        seen = jnp.arange(rows, dtype=jnp.result_type(blocks)) < blocks * window
        inputs = jnp.where(seen[:, None], u[:rows], 0).astype(empty["inputs"].dtype)
        return {**empty, "inputs": empty["inputs"].at[:rows].set(inputs)}

    def init_state(self, max_length: IntLike) -> dict[str, Array]:
        """Zero state for `step`, for decoding up to `max_length` tokens.

        `"s4"`: `{"s4": (streams * features, N / 2)}` complex modes; `"unstruct"`:
        `{"inputs": (max_length, features), "filter": (features, streams, max_length)}`
        (the filters feature-major, so that a step's product is batched over its leading
        axis).
        """
        max_length = check_int("max_length", max_length)
        channels = self.streams * self.features
        if isinstance(self.kernel, S4DKernel):
            return {"s4": zero_state(self.kernel, channels)}
        return {
            "inputs": jnp.zeros((max_length, self.features), self.down.weight.dtype),
            "filter": rearrange(self.kernel(max_length), "(s f) T -> f s T", s=self.streams),
        }

    def step(
        self, state: dict[str, Array], x_t: Float[Array | np.ndarray, " dim"], t: Position
    ) -> tuple[dict[str, Array], Float[Array, "streams features"]]:
        """One token of the same computation: `O(N)` for `"s4"`, `O(max_length)` for
        `"unstruct"`.

        **Arguments:**

        - `state`: from `init_state` or the previous `step` (its entries, shapes and
          dtypes are checked).
        - `x_t`: the input at position `t`, shape `(dim,)`.
        - `t`: the position, a scalar integer `>= 0` (below `init_state`'s `max_length`
          for `"unstruct"`; checked if not traced).

        **Returns:**

        `(state, y_t)` with `y_t` of shape `(streams, features)`.
        """
        x_t = check_features("x_t", x_t, self.down.in_features, ndim=1)
        held = held_positions(state)
        check_cache("state", state, self.init_state, held)
        return self._step(state, x_t, check_position("t", t, held))

    def _step(
        self, state: dict[str, Array], x_t: Float[Array, " dim"], t: Int[Array, ""]
    ) -> tuple[dict[str, Array], Float[Array, "streams features"]]:
        """`step` for arguments known to be valid."""
        u = self.down(x_t)
        u_all = repeat(u, "f -> (s f)", s=self.streams)
        if isinstance(self.kernel, S4DKernel):
            s4, y = recurrence_step(self.kernel, state["s4"], u_all)
            state = {"s4": s4}
        else:
            filt = state["filter"]
            if isinstance(t, jax.core.Tracer):  # (a concrete `t` is checked by `step`)
                fail_if(
                    (t < 0) | (t >= filt.shape[-1]),
                    f"the position is negative or past the end: the decoding state holds "
                    f"{filt.shape[-1]} positions (the max_length given to init_state, or to "
                    "the LM's init_cache); decode no further, or start from a larger "
                    "max_length",
                )
            inputs = state["inputs"].at[t].set(u.astype(state["inputs"].dtype))
            # y_t = sum_j filter_j u_(t - j): the inputs gathered newest first, so that
            # the filters, `streams` times larger, are read once, in place.
            lag = jnp.arange(filt.shape[-1], dtype=jnp.result_type(t))
            past = jnp.take(inputs, jnp.maximum(t - lag, 0), axis=0)
            past = jnp.where((lag <= t)[:, None], past, 0)
            y = rearrange(jnp.einsum("fsT,Tf->fs", filt, past), "f s -> (s f)")
            state = {"inputs": inputs, "filter": filt}
        y = y.astype(u.dtype) + self._skip() * u_all
        return state, rearrange(y, "(s f) -> s f", s=self.streams)
