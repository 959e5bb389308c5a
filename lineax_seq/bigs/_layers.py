"""The four layers of the BiGS ablation: {GATED, STACK} x {SSM, attention} routing."""

import abc
import functools
import itertools
import math
from collections.abc import Sequence
from typing import Literal, cast

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from beartype import beartype
from jaxtyping import Array, Bool, Float, PRNGKeyArray, jaxtyped

from .._checks import (
    IntLike,
    RealScalar,
    as_arrays,
    check_choice,
    check_int,
    check_key,
    check_real,
    check_trailing_mask,
    fail_if,
)
from .._nn import apply_linear
from ..attention import MultiHeadAttention
from ..ssm._kernel import check_kernel_options
from ._ssm import DirectionalSSM, check_sequence, ssm_conv

ROUTINGS = ("ssm", "attention")
ARCHITECTURES = ("gated", "stack")
KERNELS = ("shared", "per_channel")


INIT_STD = 0.02
"""BERT's initialisation: weights truncated normal (at 2 std) with std 0.02."""


def check_init_std(init_std: object) -> float:
    """`init_std` as a Python float; a `ValueError` unless it is a positive finite real
    number (Python, NumPy or a concrete JAX scalar)."""
    return check_real("init_std", init_std)


def check_dropout(dropout: object) -> float:
    """`dropout` as a Python float; a `ValueError` unless it is a real rate in `[0, 1)`
    (Python, NumPy or a concrete JAX scalar)."""
    try:
        rate = check_real("dropout", dropout, "nonnegative")
    except ValueError:
        rate = math.nan
    if not 0 <= rate < 1:
        raise ValueError(f"dropout must be in [0, 1), got dropout={dropout!r}")
    return rate


def _known_rate(dropout: eqx.nn.Dropout, rate: float | None = None) -> float | None:
    """`dropout`'s rate if known: its own, a number or a concrete 0-d array
    (`jax.device_put` makes one of it), else (traced by `jax.jit`) `rate`, a static copy
    (a `BiGS` keeps one), else `None`."""
    p = dropout.p
    if not isinstance(p, jax.core.Tracer) and np.ndim(p) == 0:
        return float(p)
    return rate


def apply_dropout(
    dropout: eqx.nn.Dropout, x: Array, key: PRNGKeyArray | None, inference: bool | None
) -> Array:
    """`dropout(x, key=key, inference=inference)`, and `x` itself at a rate of 0, also one
    held in an array (Equinox's dropout then asks for a key)."""
    if _known_rate(dropout) == 0:
        return x
    return dropout(x, key=key, inference=inference)


def largest_rate(dropouts: Sequence[eqx.nn.Dropout], rate: float | None = None) -> float | None:
    """The largest of the `dropouts`' rates, each as `_known_rate` gives it (`rate`
    standing in for a traced one), or `None` if one is unknown."""
    rates = [_known_rate(d, rate) for d in dropouts]
    return None if None in rates else max(cast(list[float], rates))


def resolve_inference(
    dropouts: Sequence[eqx.nn.Dropout],
    key: PRNGKeyArray | None,
    inference: bool | None,
    *,
    rate: float | None = None,
) -> bool:
    """Whether dropout is off in a module holding `dropouts` (its own and its
    sublayers'; the flags of those with a rate must agree, as `eqx.nn.inference_mode`
    sets them together, else a `ValueError`): `True` when every known rate is 0
    (`rate`: a static copy of the rate, for one traced by `jax.jit`: then a run-time
    error if a traced rate is not 0 and dropout is on), else `inference`, or (`None`)
    the first module's own flag, as a Python bool (`jax.device_put` makes the flag a 0-d
    array). A `ValueError` if dropout would run (not in inference) without a `key`
    (Equinox's own error names neither the argument nor the way out); a `TypeError` if
    the flag is traced."""
    dropout = dropouts[0]
    known = largest_rate(dropouts, rate)
    if known == 0:
        traced = [d.p for d in dropouts if isinstance(d.p, jax.core.Tracer)]
        if traced and inference is not True:
            # `rate` stands in for the traced rates (to need no key): check that it may.
            on = ~jnp.asarray(dropout.inference) if inference is None else True
            fail_if(
                functools.reduce(jnp.logical_or, [jnp.any(p != 0) for p in traced]) & on,
                "the dropout rate is not the model's dropout_rate=0 (changed with "
                "eqx.tree_at?), which stands in for it under jax.jit: dropout would be "
                "skipped; jit with eqx.filter_jit, or build the model with that rate",
            )
        return True
    if inference is None:
        # Python flags of modules that drop something (arrays, as `jax.device_put` makes
        # them, are not read here: each read would wait for the device).
        flags = {
            d.inference for d in dropouts if isinstance(d.inference, bool) and _known_rate(d) != 0
        }
        if len(flags) > 1:  # one decision for all: a module's own flag would be overruled
            raise ValueError(
                "the dropout modules' `inference` flags differ (one changed with "
                "eqx.tree_at?), and one decision covers the whole model: set them together "
                "with eqx.nn.inference_mode(model, value), or pass inference=True or False"
            )
        inference = dropout.inference
    if isinstance(inference, jax.core.Tracer):
        raise TypeError(
            "the dropout modules' `inference` flag is traced (jax.jit traces every leaf; "
            "eqx.filter_jit traces it once jax.device_put has made it an array): pass "
            "inference=True or False explicitly, or jit with eqx.filter_jit and move "
            "only the arrays: params, static = eqx.partition(model, eqx.is_array); "
            "model = eqx.combine(jax.device_put(params), static)"
        )
    inference = bool(inference)
    if inference or key is not None:
        return inference
    if known is None:
        raise ValueError(
            "key is required for dropout unless inference=True: the dropout rate is traced "
            "(jax.jit traces every leaf of a module passed to it), so a rate of 0 cannot be "
            "told apart; pass a key or inference=True, or jit with eqx.filter_jit"
        )
    raise ValueError(
        f"key is required for dropout (rate {known:g}) unless inference=True or the "
        "model is in eqx.nn.inference_mode"
    )


def dense(
    in_features: int, out_features: int, *, std: float = INIT_STD, key: PRNGKeyArray
) -> eqx.nn.Linear:
    """`eqx.nn.Linear` with BERT's initialisation: truncated normal (`std`), zero bias."""
    return denses(in_features, (out_features,), std=std, key=key)[0]


def denses(
    in_features: int,
    out_features: tuple[int, ...],
    *,
    std: float = INIT_STD,
    key: PRNGKeyArray,
) -> list[eqx.nn.Linear]:
    """Several [`dense`][] layers reading the same width, drawn by ONE random call (each
    random op costs compile time when a model is built)."""
    weight = std * jr.truncated_normal(key, -2.0, 2.0, (sum(out_features), in_features))
    linears = []
    for w in jnp.split(weight, list(itertools.accumulate(out_features))[:-1]):
        # Abstract, so that Linear's own (discarded) initialisation costs no random ops.
        linear = eqx.filter_eval_shape(eqx.nn.Linear, in_features, w.shape[0], key=key)
        linears.append(
            eqx.tree_at(lambda lin: (lin.weight, lin.bias), linear, (w, jnp.zeros(w.shape[:1])))
        )
    return linears


def apply_norm(norm: eqx.nn.LayerNorm, x: Float[Array, "n dim"]) -> Float[Array, "n dim"]:
    """LayerNorm at every position."""
    return jax.vmap(norm)(x)


def gelu(x: Array) -> Array:
    """GELU (tanh approximation, as in the reference implementation)."""
    return jax.nn.gelu(x, approximate=True)


@jax.checkpoint
def _gelu_pair(a: Array, b: Array) -> Array:
    """`stack([gelu(a), gelu(b)])`, recomputed in the backward pass instead of stored."""
    return jnp.stack([gelu(a), gelu(b)])


@jax.checkpoint
def _gelu_gate(a: Array, b: Array) -> Array:
    """`gelu(a) * gelu(b)`, recomputed in the backward pass instead of stored."""
    return gelu(a) * gelu(b)


def _default_heads(dim: int) -> int:
    """The default `num_heads`: `max(1, dim // 64)` (heads of 64 features), or, where that
    does not divide `dim`, the largest count below it that does."""
    heads = max(1, dim // 64)
    while dim % heads:
        heads -= 1
    return heads


def _key_mask(mask: Bool[Array, " length"] | None) -> Bool[Array, "length length"] | None:
    return None if mask is None else jnp.broadcast_to(mask[None, :], (mask.shape[0],) * 2)


def _dropout_keys(key: PRNGKeyArray | None, n: int) -> list:
    return [None] * n if key is None else list(jr.split(key, n))


def _attention(
    dim: int,
    heads: int,
    *,
    output_projection: bool,
    projections: list[eqx.nn.Linear] | None = None,
    std: float = INIT_STD,
    key: PRNGKeyArray,
) -> MultiHeadAttention:
    """Multi-head attention with BERT's initialisation, like every other dense layer:
    `projections` (query, key, value[, output]) or new ones drawn from `key`."""
    count = 4 if output_projection else 3
    if projections is None:
        projections = denses(dim, (dim,) * count, std=std, key=key)
    mha = eqx.filter_eval_shape(
        MultiHeadAttention, dim, heads, use_bias=True, output_projection=output_projection, key=key
    )
    names = ("query_proj", "key_proj", "value_proj", "output_proj")[:count]
    return eqx.tree_at(lambda m: tuple(getattr(m, n) for n in names), mha, tuple(projections))


class _SSMSettings(eqx.Module):
    state_size: int = eqx.field(static=True)
    kernel: str = eqx.field(static=True)
    init: str = eqx.field(static=True)
    dt_min: float = eqx.field(static=True)
    dt_max: float = eqx.field(static=True)

    def make(self, dim: int, *, reverse: bool, key: PRNGKeyArray) -> DirectionalSSM:
        return DirectionalSSM(
            dim,
            reverse=reverse,
            state_size=self.state_size,
            kernel=self.kernel,  # type: ignore[arg-type]
            init=self.init,  # type: ignore[arg-type]
            dt_min=self.dt_min,
            dt_max=self.dt_max,
            key=key,
        )


class _AbstractLayer(eqx.Module):
    """What [`lineax_seq.GatedLayer`][] and [`lineax_seq.StackLayer`][] share: the
    constructor's arguments and checks, `kernels` and `__call__`. A subclass sets its
    blocks in `_build` and computes its residual update in `_apply`."""

    dropout: eqx.nn.Dropout
    dim: int = eqx.field(static=True)
    inner_dim: int = eqx.field(static=True)
    routing: str = eqx.field(static=True)
    dropout_rate: float = eqx.field(static=True)  # the rate, for `jax.jit`, which traces `p`
    _inner_factor: eqx.AbstractClassVar[int]
    _default_routing: eqx.AbstractClassVar[Literal["ssm", "attention"]]

    def __init__(
        self,
        dim: IntLike,
        *,
        inner_dim: IntLike | None,
        routing: Literal["ssm", "attention"] | None,
        num_heads: IntLike | None,
        state_size: IntLike,
        kernel: Literal["shared", "per_channel"],
        ssm_init: Literal["lin", "inv", "real", "legs"],
        dt_min: RealScalar,
        dt_max: RealScalar,
        dropout: RealScalar,
        init_std: RealScalar,
        key: PRNGKeyArray,
    ):
        """The checks and construction shared by the subclasses, whose `__init__`s give
        every argument (and the defaults)."""
        check_key("key", key)
        dim = check_int("dim", dim)
        inner_dim = self._inner_factor * dim if inner_dim is None else inner_dim
        inner_dim = check_int("inner_dim", inner_dim)
        routing = self._default_routing if routing is None else routing
        check_choice("routing", routing, ROUTINGS)
        check_choice("kernel", kernel, KERNELS)
        dropout = check_dropout(dropout)
        init_std = check_init_std(init_std)
        heads = _default_heads(dim) if num_heads is None else num_heads
        heads = check_int("num_heads", heads)
        dt_min, dt_max = check_kernel_options(
            state_size, ssm_init, "zoh", dt_min, dt_max, init_name="ssm_init"
        )
        ssm = _SSMSettings(int(state_size), kernel, ssm_init, dt_min, dt_max)
        self._build(dim, inner_dim, routing, heads, ssm, init_std, key)
        self.dropout = eqx.nn.Dropout(dropout)
        self.dim = dim
        self.inner_dim = inner_dim
        self.routing = routing
        self.dropout_rate = dropout

    @abc.abstractmethod
    def _build(
        self,
        dim: int,
        inner_dim: int,
        routing: str,
        heads: int,
        ssm: _SSMSettings,
        std: float,
        key: PRNGKeyArray,
    ) -> None:
        """Set the subclass's blocks."""

    @abc.abstractmethod
    def _ssms(self) -> tuple[DirectionalSSM, DirectionalSSM] | None:
        """The forward and backward SSMs (`routing="ssm"`), else `None`."""

    @abc.abstractmethod
    def _apply(
        self,
        x: Float[Array, "length dim"],
        mask: Bool[Array, " length"] | None,
        key: PRNGKeyArray | None,
        inference: bool | None,
    ) -> Float[Array, "length dim"]:
        """The layer's output, `x` plus the dropped-out residual branch(es), at every
        position (the caller zeroes the padded ones)."""

    def kernels(
        self, length: IntLike
    ) -> tuple[Float[Array, "kc {length}"], Float[Array, "kc {length}"]]:
        """The forward and backward SSM kernels at `length` (`routing="ssm"` only).

        `forward[:, j]` weighs the input `j` positions before the output; `backward[:, j]`
        the input `j` positions after it. `kc` = 1 (shared kernel) or `dim`.
        """
        ssms = self._ssms()
        if ssms is None:
            raise ValueError(f"kernels() needs routing='ssm', this layer has {self.routing!r}")
        forward, backward = ssms
        return forward.kernel(length), backward.kernel(length)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        x: Float[Array | np.ndarray, "length dim"],
        mask: Bool[Array | np.ndarray, " length"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> Float[Array, "length dim"]:
        """Apply the layer.

        **Arguments:**

        - `x`: input `X_i`, shape `(length, dim)`.
        - `mask`: optional, `True` at real tokens, then `False` at trailing padding
          (any other mask is an error: at once, or at run time under `jit` or
          `jax.vmap`); padded rows of `x` are read as 0, whatever they hold.
        - `key`: dropout key (needed if `dropout > 0` and not `inference`).
        - `inference`: disable dropout; `None` (default) defers to the dropout modules'
          own flag, which `eqx.nn.inference_mode` sets (the flags of one model must agree).

        **Returns:**

        `X_{i+1}`, shape `(length, dim)`; zero at padded positions if `mask` is given.
        """
        x, mask = as_arrays(x, mask)
        check_sequence("x", x, mask, self.dim)
        check_trailing_mask(mask)
        inference = resolve_inference((self.dropout,), key, inference, rate=self.dropout_rate)
        if mask is not None:  # any padding, NaN too, is read as 0 (BiGS pads with zeros)
            x = jnp.where(mask[:, None], x, 0)
        return self._masked_apply(x, mask, key, inference)

    def _masked_apply(self, x, mask, key, inference):
        """`_apply` with padded positions of the output zeroed; inputs already checked."""
        out = self._apply(x, mask, key, inference)
        return out if mask is None else jnp.where(mask[:, None], out, 0)


class GatedLayer(_AbstractLayer):
    """The GATED layer; with `routing="ssm"` this is the BiGS layer.

    Pre-LayerNorm, with `sigma` = GELU, `Flip` reversing the sequence and `inner` =
    `inner_dim` (`3d` in BiGS-Large):

    ```
    X  = LN(X_i)                                   (L, d)
    V  = sigma(W_v X)                              (L, inner)
    F  = sigma(W_f X)                              (L, d)
    B  = sigma(W_b Flip(X))                        (L, d)
    U1 = W_u1 SSM_f(F)                             (L, d)
    U2 = W_u2 SSM_b(B)                             (L, d)
    U  = sigma(W_u (U1 * Flip(U2)))                (L, inner)
    O  = W_o (U * V)                               (L, d)
    X_{i+1} = X_i + Dropout(O)
    ```

    about `13 d^2` parameters for `inner = 3d`. `Flip(SSM_b(Flip(.)))` is the
    anti-causal convolution of `DirectionalSSM(reverse=True)`; both directions run in
    one pass (one batched Toeplitz product up to 512 positions, chunked matrix
    products above, see [`lineax_seq.DirectionalSSM`][]). With `routing="attention"`
    each SSM is replaced by bidirectional
    multi-head self-attention (without its own output projection, which `W_u1`/`W_u2`
    already provide; attention is flip-equivariant, so the flips cancel): about
    `19 d^2` parameters.

    **Padding.** With `mask` (trailing padding), `F` and `B` are zeroed at padded
    positions (and attention cannot read them), so the backward SSM starts at each
    example's last real token; outputs at real positions do not depend on the amount
    or content of padding, and padded positions of the output are zero.
    """

    norm: eqx.nn.LayerNorm
    v_proj: eqx.nn.Linear
    f_proj: eqx.nn.Linear
    b_proj: eqx.nn.Linear
    forward_routing: DirectionalSSM | MultiHeadAttention
    backward_routing: DirectionalSSM | MultiHeadAttention
    u1_proj: eqx.nn.Linear
    u2_proj: eqx.nn.Linear
    u_proj: eqx.nn.Linear
    out_proj: eqx.nn.Linear
    _inner_factor = 3
    _default_routing = "ssm"

    def __init__(
        self,
        dim: IntLike,
        *,
        inner_dim: IntLike | None = None,
        routing: Literal["ssm", "attention"] | None = None,
        num_heads: IntLike | None = None,
        state_size: IntLike = 64,
        kernel: Literal["shared", "per_channel"] = "shared",
        ssm_init: Literal["lin", "inv", "real", "legs"] = "legs",
        dt_min: RealScalar = 0.01,
        dt_max: RealScalar = 1.0,
        dropout: RealScalar = 0.0,
        init_std: RealScalar = INIT_STD,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: model width `d`.
        - `inner_dim`: width of `V` and `U` (default `3 * dim`).
        - `routing`: `"ssm"` (the default: BiGS) or `"attention"`.
        - `num_heads`: attention heads (`routing="attention"`; default `max(1, dim // 64)`,
            or the largest count below it that divides `dim`).
        - `state_size`, `kernel`, `ssm_init`, `dt_min`, `dt_max`: the SSMs, see
            [`lineax_seq.DirectionalSSM`][] (`routing="ssm"`).
        - `dropout`: dropout rate on each residual branch.
        - `init_std`: std of the truncated-normal weights (BERT's 0.02; see
            [`lineax_seq.BiGS`][] on small widths).
        - `key`: a `jax.random.key`.
        """
        super().__init__(
            dim,
            inner_dim=inner_dim,
            routing=routing,
            num_heads=num_heads,
            state_size=state_size,
            kernel=kernel,
            ssm_init=ssm_init,
            dt_min=dt_min,
            dt_max=dt_max,
            dropout=dropout,
            init_std=init_std,
            key=key,
        )

    def _build(self, dim, inner_dim, routing, heads, ssm, std, key):
        keys = jr.split(key, 4)
        self.norm = eqx.nn.LayerNorm(dim, eps=1e-6)
        widths = (inner_dim, dim, dim, dim, dim, inner_dim)
        v, f, b, u1, u2, u = denses(dim, widths, std=std, key=keys[0])
        self.v_proj, self.f_proj, self.b_proj = v, f, b
        if routing == "ssm":
            self.forward_routing = ssm.make(dim, reverse=False, key=keys[1])
            self.backward_routing = ssm.make(dim, reverse=True, key=keys[2])
        else:
            self.forward_routing, self.backward_routing = (
                _attention(dim, heads, output_projection=False, std=std, key=k) for k in keys[1:3]
            )
        self.u1_proj, self.u2_proj, self.u_proj = u1, u2, u
        self.out_proj = dense(inner_dim, dim, std=std, key=keys[3])

    def _ssms(self):
        forward, backward = self.forward_routing, self.backward_routing
        if isinstance(forward, DirectionalSSM) and isinstance(backward, DirectionalSSM):
            return forward, backward
        return None

    def _apply(self, x, mask, key, inference):
        h = apply_norm(self.norm, x)
        # Three products, not one of the concatenated weights: on CPU at 1k-4k tokens
        # that was 3-5% slower, its gradient concatenating a (length, inner + 2d) array.
        # B is computed unflipped (sigma and W_b act per position); the backward
        # routing reads it anti-causally. The GELUs of F, B and of the gate U * V are
        # recomputed in the backward pass, not stored (`_gelu_pair`, `_gelu_gate`):
        # less memory and, on CPU, 2-4% less time at 128-4k tokens.
        z_v = apply_linear(self.v_proj, h)
        z_f, z_b = apply_linear(self.f_proj, h), apply_linear(self.b_proj, h)
        ssms = self._ssms()
        if ssms is not None:
            # Both SSMs in one pass (one batched Toeplitz / chunked product).
            fb = _gelu_pair(z_f, z_b)
            if mask is not None:
                fb = jnp.where(mask[None, :, None], fb, 0)
            y_f, y_b = ssm_conv(fb, ssms)
        else:
            y_f = self.forward_routing(gelu(z_f), mask=_key_mask(mask))
            y_b = self.backward_routing(gelu(z_b), mask=_key_mask(mask))
        u1 = apply_linear(self.u1_proj, y_f)
        u2 = apply_linear(self.u2_proj, y_b)
        o = apply_linear(self.out_proj, _gelu_gate(apply_linear(self.u_proj, u1 * u2), z_v))
        return x + apply_dropout(self.dropout, o, key, inference)


class _SSMBlock(eqx.Module):
    """Pre-LN residual SSM block of STACK/SSM: `W_out sigma(SSM(W_in LN(x)))`."""

    norm: eqx.nn.LayerNorm
    in_proj: eqx.nn.Linear
    ssm: DirectionalSSM
    out_proj: eqx.nn.Linear

    def __call__(self, x, mask):
        h = apply_linear(self.in_proj, apply_norm(self.norm, x))
        return apply_linear(self.out_proj, gelu(self.ssm(h, mask)))


class _AttentionBlock(eqx.Module):
    """Pre-LN residual attention block of STACK/ATT (BERT): `MHA(LN(x))`."""

    norm: eqx.nn.LayerNorm
    attention: MultiHeadAttention

    def __call__(self, x, mask):
        return self.attention(apply_norm(self.norm, x), mask=_key_mask(mask))


class StackLayer(_AbstractLayer):
    """The STACK layer: a pre-LN transformer block; `routing="attention"` is BERT.

    ```
    routing="attention":  X <- X + Dropout(MHA(LN(X)))
    routing="ssm":        X <- X + Dropout(W_fo sigma(SSM_f(W_fi LN(X))))      forward
                          X <- X + Dropout(W_bo sigma(SSM_b(W_bi LN(X))))      backward
    then:                 X <- X + Dropout(W_2 sigma(W_1 LN(X)))               (d -> inner -> d)
    ```

    i.e. the attention block is replaced by two sequential SSM blocks (forward, then
    backward, where `SSM_b = Flip . SSM . Flip` is an anti-causal convolution). Both
    routings have about `12 d^2` parameters for `inner = 4d` (the SSM blocks' four
    `d x d` projections stand in for attention's query/key/value/output). Dropout acts
    on the residual branches only, not (as in BERT) on the attention probabilities.

    **Padding.** As [`lineax_seq.GatedLayer`][]: the SSM inputs are zeroed at padded
    positions and attention cannot read them, so outputs at real positions do not
    depend on trailing padding; padded positions of the output are zero.
    """

    routing_blocks: tuple[_SSMBlock, _SSMBlock] | tuple[_AttentionBlock]
    mlp_norm: eqx.nn.LayerNorm
    mlp_in: eqx.nn.Linear
    mlp_out: eqx.nn.Linear
    _inner_factor = 4
    _default_routing = "attention"

    def __init__(
        self,
        dim: IntLike,
        *,
        inner_dim: IntLike | None = None,
        routing: Literal["ssm", "attention"] | None = None,
        num_heads: IntLike | None = None,
        state_size: IntLike = 64,
        kernel: Literal["shared", "per_channel"] = "shared",
        ssm_init: Literal["lin", "inv", "real", "legs"] = "legs",
        dt_min: RealScalar = 0.01,
        dt_max: RealScalar = 1.0,
        dropout: RealScalar = 0.0,
        init_std: RealScalar = INIT_STD,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: model width `d`.
        - `inner_dim`: feed-forward width (default `4 * dim`).
        - `routing`: `"attention"` (the default: BERT) or `"ssm"`.
        - `num_heads`: attention heads (`routing="attention"`; default `max(1, dim // 64)`,
            or the largest count below it that divides `dim`).
        - `state_size`, `kernel`, `ssm_init`, `dt_min`, `dt_max`: the SSMs, see
            [`lineax_seq.DirectionalSSM`][] (`routing="ssm"`).
        - `dropout`: dropout rate on each residual branch.
        - `init_std`: std of the truncated-normal weights (BERT's 0.02; see
            [`lineax_seq.BiGS`][] on small widths).
        - `key`: a `jax.random.key`.
        """
        super().__init__(
            dim,
            inner_dim=inner_dim,
            routing=routing,
            num_heads=num_heads,
            state_size=state_size,
            kernel=kernel,
            ssm_init=ssm_init,
            dt_min=dt_min,
            dt_max=dt_max,
            dropout=dropout,
            init_std=init_std,
            key=key,
        )

    def _build(self, dim, inner_dim, routing, heads, ssm, std, key):
        keys = jr.split(key, 4)
        # The four d x d projections (SSM blocks' in/out, or attention's q/k/v/o) and W_1.
        *square, self.mlp_in = denses(dim, (dim,) * 4 + (inner_dim,), std=std, key=keys[0])
        if routing == "ssm":
            block = lambda i: _SSMBlock(
                eqx.nn.LayerNorm(dim, eps=1e-6),
                square[2 * i],
                ssm.make(dim, reverse=bool(i), key=keys[1 + i]),
                square[2 * i + 1],
            )
            self.routing_blocks = (block(0), block(1))
        else:
            mha = _attention(dim, heads, output_projection=True, projections=square, key=keys[1])
            self.routing_blocks = (_AttentionBlock(eqx.nn.LayerNorm(dim, eps=1e-6), mha),)
        self.mlp_norm = eqx.nn.LayerNorm(dim, eps=1e-6)
        self.mlp_out = dense(inner_dim, dim, std=std, key=keys[3])

    def _ssms(self):
        if len(self.routing_blocks) != 2:
            return None
        forward, backward = self.routing_blocks
        return forward.ssm, backward.ssm

    def _apply(self, x, mask, key, inference):
        keys = _dropout_keys(key, len(self.routing_blocks) + 1)
        for block, k in zip(self.routing_blocks, keys, strict=False):
            x = x + apply_dropout(self.dropout, block(x, mask), k, inference)
        h = gelu(apply_linear(self.mlp_in, apply_norm(self.mlp_norm, x)))
        x = x + apply_dropout(self.dropout, apply_linear(self.mlp_out, h), keys[-1], inference)
        return x
