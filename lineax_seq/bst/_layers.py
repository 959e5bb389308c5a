"""Block transformer layers: sliding window (SLIDE), Block-State (BST), Block-Recurrent (BRECT).

All three share the block transformer cell of Hutchins et al. (2022): pre-LayerNorm,
causal sliding-window self-attention over blocks of `window` tokens (each block also
sees the previous block's keys/values), a T5 relative position bias instead of absolute
positions, and a ReLU MLP, both with residuals. BST and BRECT add cross-attention from
the tokens to a set of context states; its output is concatenated with the
self-attention heads and projected back to `dim` by one linear map.

Every layer also has a decoding mode: `init_cache(max_length)` and
`step(cache, x_t, t) -> (cache, y_t)` reproduce `__call__` one token at a time. `step`
checks its arguments when traced too: the cache's entries, shapes and dtypes against
`init_cache`'s, and `t`, a scalar integer (its value, `>= 0`, if not traced).

A cache holds the parameters' dtypes (the key/value projections', the recurrent
states', the SSM kernel's). What a step computes in a wider dtype (a float32 `x_t` into a
bfloat16 layer, or float32 LayerNorms in a bfloat16 model) is rounded to them when it is
stored, so decoding then matches `__call__` to that rounding.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from beartype import beartype
from einops import rearrange
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, jaxtyped

from .._checks import IntLike, RealScalar, check_choice, check_int, check_key
from .._nn import apply_linear, varying_like
from .._numerics import work_dtype
from ..attention import MultiHeadAttention, SlidingWindowAttention
from ..attention._core import attend, check_implementation
from ..attention._window import block_attention, check_sequence, check_window
from ._ssm import (
    ContextSSM,
    Position,
    check_cache,
    check_features,
    check_position,
    held_positions,
)

CONTEXTS = ("sh", "mh", "mf")
Cache = dict


def _norm(norm: eqx.nn.LayerNorm, x: Float[Array, "*batch dim"]) -> Float[Array, "*batch dim"]:
    # In float32 at least, as `eqx.nn.LayerNorm`: in bfloat16, `x - mean` loses about
    # `eps * |mean| / std` (a residual stream's offset) before the normalisation.
    dtype = jnp.result_type(x, norm.weight, norm.bias)  # the result's, as before
    work = work_dtype(dtype)  # float64 stays, narrower types run in float32
    x = x.astype(work)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + norm.eps)
    y = y if norm.weight is None else y * norm.weight.astype(work)
    y = y if norm.bias is None else y + norm.bias.astype(work)
    return y.astype(dtype)


def _heads(x: Float[Array, "*batch dim"], num_heads: int) -> Float[Array, "*batch heads hd"]:
    return rearrange(x, "... (h d) -> ... h d", h=num_heads)


def _merge(x: Float[Array, "*batch heads hd"]) -> Float[Array, "*batch dim"]:
    return rearrange(x, "... h d -> ... (h d)")


class _MLP(eqx.Module):
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, dim: int, hidden: int, *, key: PRNGKeyArray):
        ku, kd = jr.split(key)
        self.up = eqx.nn.Linear(dim, hidden, key=ku)
        self.down = eqx.nn.Linear(hidden, dim, key=kd)

    def __call__(self, x: Float[Array, "*batch dim"]) -> Float[Array, "*batch dim"]:
        return apply_linear(self.down, jax.nn.relu(apply_linear(self.up, x)))


def _check_step(
    layer: "SlidingWindowLayer | BlockStateTransformerLayer | BlockRecurrentTransformerLayer",
    cache: Cache,
    t: Position,
) -> Int[Array, ""]:
    """`t` as an int32 scalar, once `cache` and `t` are checked as `step` takes them
    (see the module docstring)."""
    held = held_positions(cache)
    check_cache("cache", cache, layer.init_cache, held)
    return check_position("t", t, held)


def _mlp_dim(dim: int, mlp_dim: IntLike | None) -> int:
    return 4 * check_int("dim", dim) if mlp_dim is None else check_int("mlp_dim", mlp_dim)


# --------------------------------------------------------------------------- decoding helpers


def _stored(new, like):
    """`new` in the dtypes of `like` (a PyTree of the same structure): what a decoding
    step stores is rounded to the cache's dtypes (see the module docstring)."""
    return jax.tree.map(lambda a, b: a.astype(b.dtype), new, like)


def _init_frame(attention: SlidingWindowAttention) -> Cache:
    mha = attention.attention
    shape = (2 * attention.window, mha.num_heads, mha.head_dim)
    dtype = mha.key_proj.weight.dtype  # the keys' dtype (float64 params under x64, bf16...)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def _self_attention_step(
    attention: SlidingWindowAttention, frame: Cache, h_t: Float[Array, " dim"], t: Int[Array, ""]
) -> tuple[Cache, Float[Array, "heads hd"]]:
    """One query of `sliding_window_attention`, keeping a `[previous | current]` block frame.

    The frame holds the keys/values of the previous block and of the current block so far:
    exactly the keys that the block-parallel computation gives the query at offset
    `r = t % window`, with the same mask row and relative bias row, so the result is the
    same to rounding. Cost `O(window)`.
    """
    w = attention.window
    r = t % w
    shift = lambda a: jnp.concatenate([a[w:], jnp.zeros_like(a[w:])])
    frame = jax.tree.map(lambda a: jnp.where(r == 0, shift(a), a), frame)
    q = attention.attention.queries(h_t[None])
    k, v = _stored(attention.attention.keys_values(h_t[None]), (frame["k"], frame["v"]))
    frame = {
        "k": jax.lax.dynamic_update_slice_in_dim(frame["k"], k, w + r, axis=0),
        "v": jax.lax.dynamic_update_slice_in_dim(frame["v"], v, w + r, axis=0),
    }
    c = jnp.arange(2 * w, dtype=jnp.result_type(r))
    mask = (c > r) & (c <= w + r) & ((t >= w) | (c >= w))
    bias = attention.relative_bias(1, 2 * w, query_offset=w + r)
    out = attend(q, frame["k"], frame["v"], bias=bias, mask=mask[None])
    return frame, out[0]


def _prefill_frame(attention: SlidingWindowAttention, h: Array, blocks: Int[Array, ""]) -> Cache:
    """The attention frame after the first `blocks` blocks of `h`: their last block's
    keys/values in its second half (the first is shifted out by the next token)."""
    w = attention.window
    k, v = attention.attention.keys_values(h)
    last = lambda a: jax.lax.dynamic_slice_in_dim(a, jnp.maximum(blocks - 1, 0) * w, w)
    frame = {
        name: jnp.concatenate([jnp.zeros_like(last(a)), last(a)])
        for name, a in (("k", k), ("v", v))
    }
    return _stored(frame, _init_frame(attention))


# --------------------------------------------------------------------------- SLIDE


class SlidingWindowLayer(eqx.Module):
    """Sliding-window block transformer layer (the SLIDE baseline; no context states).

    `x + SWA(LN(x))` then `x + MLP(LN(x))`, with causal sliding-window attention over
    blocks of `window` tokens (every token sees the `window` latest tokens) and a T5
    relative position bias.
    """

    attention_norm: eqx.nn.LayerNorm
    attention: SlidingWindowAttention
    mlp_norm: eqx.nn.LayerNorm
    mlp: _MLP
    window: int = eqx.field(static=True)

    def __init__(
        self,
        dim: IntLike,
        num_heads: IntLike,
        window: IntLike,
        *,
        mlp_dim: IntLike | None = None,
        attention_implementation: str | None = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: feature size; divisible by `num_heads`.
        - `num_heads`: attention heads.
        - `window`: block / window size `W`.
        - `mlp_dim`: hidden size of the ReLU MLP (default `4 * dim`).
        - `attention_implementation`: the attention kernel of the parallel forward pass,
          `None` / `"xla"` or `"cudnn"` (see [`lineax_seq.MultiHeadAttention`][]);
          decoding steps always use XLA.
        - `key`: PRNG key.
        """
        check_key("key", key)
        dim = check_int("dim", dim)
        window = check_window(window)
        check_implementation(attention_implementation, "attention_implementation")
        ka, km = jr.split(key)
        self.attention_norm = eqx.nn.LayerNorm(dim)
        self.attention = SlidingWindowAttention(
            dim, num_heads, window, implementation=attention_implementation, key=ka
        )
        self.mlp_norm = eqx.nn.LayerNorm(dim)
        self.mlp = _MLP(dim, _mlp_dim(dim, mlp_dim), key=km)
        self.window = window

    @jaxtyped(typechecker=beartype)
    def __call__(
        self, x: Float[Array | np.ndarray, "length dim"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "length dim"]:
        """**Arguments:**

        - `x`: shape `(length, dim)`, `length` a multiple of `window`.
        - `key`: ignored (the layer is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        Shape `(length, dim)`.
        """
        x = jnp.asarray(x)
        check_sequence(x, self.window, self.attention.attention.dim)
        x = x + self.attention(_norm(self.attention_norm, x))
        return x + self.mlp(_norm(self.mlp_norm, x))

    def init_cache(self, max_length: IntLike) -> Cache:
        """Empty decoding cache (the attention frame; `O(window)` memory) for sequences of
        up to `max_length` positions (checked; the frame's size does not depend on it)."""
        check_int("max_length", max_length)
        return {"frame": _init_frame(self.attention)}

    def step(
        self, cache: Cache, x_t: Float[Array | np.ndarray, " dim"], t: Position
    ) -> tuple[Cache, Float[Array, " dim"]]:
        """Process the token at position `t`; see the module docstring.

        `x_t` is `(dim,)`; returns `(cache, y_t)` with `y_t` `(dim,)`.
        """
        x_t = check_features("x_t", x_t, self.attention.attention.dim, ndim=1)
        return _jitted_step(self, cache, x_t, _check_step(self, cache, t))

    def _step(
        self, cache: Cache, x_t: Float[Array, " dim"], t: Int[Array, ""]
    ) -> tuple[Cache, Float[Array, " dim"]]:
        frame, heads = _self_attention_step(
            self.attention, cache["frame"], _norm(self.attention_norm, x_t), t
        )
        x_t = x_t + self.attention.attention.merge_heads(heads[None])[0]
        return {"frame": frame}, x_t + self.mlp(_norm(self.mlp_norm, x_t))

    def _prefill(
        self, x: Float[Array, "length dim"], blocks: Int[Array, ""], max_length: int
    ) -> tuple[Cache, Float[Array, "length dim"]]:
        """`(cache, self(x))`: the cache as after `step` through the first `blocks`
        blocks of `x` (the later positions, if any, do not reach it)."""
        h = _norm(self.attention_norm, x)
        return {"frame": _prefill_frame(self.attention, h, blocks)}, self(x)


# --------------------------------------------------------------------------- context states


class _PositionContext(eqx.Module):
    """SH / MH: the SSM outputs at the block's own positions, causal mask.

    SH: one stream of `features`, lifted to every head by the key/value projections.
    MH: one stream per head (each from its own kernels), each head projecting only its
    own stream.
    """

    key_proj: Float[Array, "..."]
    value_proj: Float[Array, "..."]
    multi_head: bool = eqx.field(static=True)

    def __init__(
        self, features: int, dim: int, num_heads: int, *, multi_head: bool, key: PRNGKeyArray
    ):
        kk, kv = jr.split(key)
        lim = 1 / math.sqrt(features)
        head_dim = dim // num_heads
        shape = (num_heads, features, head_dim) if multi_head else (features, num_heads, head_dim)
        self.key_proj = jr.uniform(kk, shape, minval=-lim, maxval=lim)
        self.value_proj = jr.uniform(kv, shape, minval=-lim, maxval=lim)
        self.multi_head = multi_head

    def _kv(self, y: Float[Array, "*batch streams features"]):
        if self.multi_head:
            lift = lambda w: jnp.einsum("...hf,hfd->...hd", y, w)
        else:
            lift = lambda w: jnp.einsum("...f,fhd->...hd", y[..., 0, :], w)
        return lift(self.key_proj), lift(self.value_proj)

    def keys_values(self, y: Float[Array, "length streams features"], window: int):
        split = lambda a: rearrange(a, "(n w) h d -> n w h d", w=window)
        k, v = self._kv(y)
        return split(k), split(v)

    def mask(self, window: int) -> Bool[Array, "w w"]:
        return jnp.tril(jnp.ones((window, window), bool))

    def init_cache(self, window: int, head_dim: int) -> Cache:
        heads = self.key_proj.shape[0 if self.multi_head else 1]
        shape = (window, heads, head_dim)
        dtype = self.key_proj.dtype
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}

    def step(self, cache: Cache, y_t, t: Int[Array, ""], window: int):
        r = t % window
        k, v = _stored(self._kv(y_t[None]), (cache["k"], cache["v"]))
        cache = {
            "k": jax.lax.dynamic_update_slice_in_dim(cache["k"], k, r, axis=0),
            "v": jax.lax.dynamic_update_slice_in_dim(cache["v"], v, r, axis=0),
        }
        return cache, jnp.arange(window, dtype=jnp.result_type(r)) <= r


class _MultiFilterContext(eqx.Module):
    """MF: the `S` filter outputs at the last position of the previous block, plus IDs."""

    lift: eqx.nn.Linear
    context_ids: Float[Array, "filters dim"]
    initial: Float[Array, "filters features"]
    key_proj: eqx.nn.Linear
    value_proj: eqx.nn.Linear
    num_heads: int = eqx.field(static=True)

    def __init__(
        self, features: int, dim: int, num_heads: int, num_filters: int, *, key: PRNGKeyArray
    ):
        kl, ki, k0, kk, kv = jr.split(key, 5)
        self.lift = eqx.nn.Linear(features, dim, key=kl)
        self.context_ids = 0.02 * jr.normal(ki, (num_filters, dim))
        self.initial = jr.normal(k0, (num_filters, features))
        self.key_proj = eqx.nn.Linear(dim, dim, key=kk)
        self.value_proj = eqx.nn.Linear(dim, dim, key=kv)
        self.num_heads = num_heads

    def _kv(self, context: Float[Array, "*batch filters features"]):
        z = apply_linear(self.lift, context) + self.context_ids
        k = _heads(apply_linear(self.key_proj, z), self.num_heads)
        v = _heads(apply_linear(self.value_proj, z), self.num_heads)
        return k, v

    def keys_values(self, last: Float[Array, "blocks filters features"], window: int):
        """`last`: the SSM outputs at the last position of every block."""
        context = jnp.concatenate([self.initial[None], last[:-1]])  # block b <- block b - 1
        return self._kv(context)

    def mask(self, window: int) -> None:
        return None

    def init_cache(self, window: int, head_dim: int) -> Cache:
        k, v = self._kv(self.initial)
        return {"k": k, "v": v, "last": jnp.zeros_like(self.initial)}

    def step(self, cache: Cache, y_t, t: Int[Array, ""], window: int):
        # The context changes once a block: its keys/values are computed then, not for
        # every token.
        context = jnp.where(t == 0, self.initial, cache["last"])
        # `context` holds `initial`'s dtype (`last` is stored in it), as `init_cache`'s did.
        k, v = jax.lax.cond(
            t % window == 0, lambda: self._kv(context), lambda: (cache["k"], cache["v"])
        )
        return {"k": k, "v": v, "last": y_t.astype(cache["last"].dtype)}, None


# --------------------------------------------------------------------------- BST


class BlockStateTransformerLayer(eqx.Module):
    """Block-State Transformer layer (Fathi et al. 2023, section 2.3).

    An SSM sublayer ([`lineax_seq.ContextSSM`][]: down projection to
    `ssm_features`, S4D kernels or Hyena filters over the whole sequence) turns
    the normalised input into context states; a block transformer cell then processes
    all blocks of `window` tokens in parallel:

    `x + Out([SWA(LN x) ; CrossAttn(LN x, context)])`, then `x + MLP(LN x)`.

    Context states (`context=`):

    - `"sh"` Single-Head: the SSM output (one stream of `ssm_features`) at the block's own
      `window` positions, lifted to the heads by the key/value projections; token `i`
      sees the context at positions `<= i` (causal mask).
    - `"mh"` Multi-Head: `num_heads` SSM output streams; head `h` attends to stream `h`
      with the same causal mask. Each stream has its own S4D kernel (`A`, `B`, `C` and
      step size), as in the paper's Pseudocode 2.3; section 2.3.3's text describes one
      state read by separate `C_h`, which would share `A`, `B` and the step size.
      Each head lifts its own `ssm_features`-wide stream, so MH has SH's projection
      parameters plus its kernels' (0.1% more at the paper's LM size); the paper's MH has
      8% more parameters (section 2.4.1), from a layout its text does not give.
    - `"mf"` Multi-Filter: `num_filters` streams; block `b` attends to the `S` outputs at
      the last position of block `b - 1` (a learned initial context for block 0), lifted
      to `dim` plus learned context IDs. No mask needed.
    """

    attention_norm: eqx.nn.LayerNorm
    self_attention: SlidingWindowAttention
    ssm: ContextSSM
    context: _PositionContext | _MultiFilterContext
    cross_query: eqx.nn.Linear
    output: eqx.nn.Linear
    mlp_norm: eqx.nn.LayerNorm
    mlp: _MLP
    window: int = eqx.field(static=True)
    num_heads: int = eqx.field(static=True)
    context_kind: str = eqx.field(static=True)

    def __init__(
        self,
        dim: IntLike,
        num_heads: IntLike,
        window: IntLike,
        *,
        context: str = "sh",
        ssm: str = "s4",
        state_size: IntLike = 16,
        dt_min: RealScalar = 1e-3,
        dt_max: RealScalar = 1e-1,
        ssm_features: IntLike | None = None,
        num_filters: IntLike = 32,
        mlp_dim: IntLike | None = None,
        max_length: IntLike | None = None,
        attention_implementation: str | None = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: feature size; divisible by `num_heads`.
        - `num_heads`: attention heads (self- and cross-attention).
        - `window`: block / window size `W`.
        - `context`: `"sh"`, `"mh"` or `"mf"` (see above).
        - `ssm`: `"s4"` (S4D kernels) or `"unstruct"` (Hyena filters).
        - `state_size`: S4D state size `N` (the paper's speed setting: 16).
        - `dt_min`, `dt_max`: initial S4D step-size range (`ssm="s4"`; see
          [`lineax_seq.ContextSSM`][]).
        - `ssm_features`: width of the SSM after the down projection (default `dim // 4`,
          and `dim // 8` for `"mf"`).
        - `num_filters`: `S`, the number of MF context states (paper: 32); checked, but
          unused, for `"sh"` and `"mh"`.
        - `mlp_dim`: ReLU MLP hidden size (default `4 * dim`).
        - `max_length`: training length (required for `ssm="unstruct"`; Hyena positions
          are normalised by it).
        - `attention_implementation`: the kernel of the self- and cross-attention in the
          parallel forward pass, `None` / `"xla"` or `"cudnn"` (see
          [`lineax_seq.MultiHeadAttention`][]); decoding steps always use XLA.
        - `key`: PRNG key.
        """
        check_key("key", key)
        window = check_window(window)
        check_implementation(attention_implementation, "attention_implementation")
        dim = check_int("dim", dim)
        num_heads = check_int("num_heads", num_heads)
        check_choice("context", context, CONTEXTS)
        ka, ks, kc, kq, ko, km = jr.split(key, 6)
        self.attention_norm = eqx.nn.LayerNorm(dim)
        self.self_attention = SlidingWindowAttention(
            dim,
            num_heads,
            window,
            output_projection=False,
            implementation=attention_implementation,
            key=ka,
        )
        if ssm_features is None:
            ssm_features = dim // 8 if context == "mf" else dim // 4
            if ssm_features < 1:
                raise ValueError(
                    f"`dim`={dim} is too small for the default SSM width (dim // "
                    f"{8 if context == 'mf' else 4}); pass `ssm_features`."
                )
        ssm_features = check_int("ssm_features", ssm_features)
        num_filters = check_int("num_filters", num_filters)
        streams = {"sh": 1, "mh": num_heads, "mf": num_filters}[context]
        self.ssm = ContextSSM(
            dim,
            ssm_features,
            streams,
            ssm=ssm,
            state_size=state_size,
            dt_min=dt_min,
            dt_max=dt_max,
            max_length=max_length,
            key=ks,
        )
        if context in ("sh", "mh"):
            self.context = _PositionContext(
                ssm_features, dim, num_heads, multi_head=context == "mh", key=kc
            )
        else:
            self.context = _MultiFilterContext(ssm_features, dim, num_heads, num_filters, key=kc)
        self.cross_query = eqx.nn.Linear(dim, dim, key=kq)
        self.output = eqx.nn.Linear(2 * dim, dim, key=ko)
        self.mlp_norm = eqx.nn.LayerNorm(dim)
        self.mlp = _MLP(dim, _mlp_dim(dim, mlp_dim), key=km)
        self.window = window
        self.num_heads = num_heads
        self.context_kind = context

    @jaxtyped(typechecker=beartype)
    def __call__(
        self, x: Float[Array | np.ndarray, "length dim"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "length dim"]:
        """**Arguments:**

        - `x`: shape `(length, dim)`, `length` a multiple of `window`.
        - `key`: ignored (the layer is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        Shape `(length, dim)`.
        """
        x = jnp.asarray(x)
        check_sequence(x, self.window, self.self_attention.attention.dim)
        h = _norm(self.attention_norm, x)
        self_heads = self.self_attention.heads(h)
        if self.context_kind == "mf":  # MF reads the block-end outputs only
            y = self.ssm.block_ends(h, self.window)
        else:
            y = self.ssm(h)
        k, v = self.context.keys_values(y, self.window)
        q = rearrange(
            apply_linear(self.cross_query, h),
            "(n w) (h d) -> n w h d",
            w=self.window,
            h=self.num_heads,
        )
        mask = self.context.mask(self.window)
        cross = block_attention(
            q, k, v, mask=mask, implementation=self.self_attention.attention.implementation
        )
        cross = rearrange(cross, "n w h d -> (n w) (h d)")
        x = x + apply_linear(self.output, jnp.concatenate([_merge(self_heads), cross], axis=-1))
        return x + self.mlp(_norm(self.mlp_norm, x))

    def init_cache(self, max_length: IntLike) -> Cache:
        """Empty decoding cache for sequences of up to `max_length` positions: attention
        frame, SSM state and current-block context."""
        max_length = check_int("max_length", max_length)
        return {
            "frame": _init_frame(self.self_attention),
            "ssm": self.ssm.init_state(max_length),
            "context": self.context.init_cache(self.window, self.self_attention.attention.head_dim),
        }

    def step(
        self, cache: Cache, x_t: Float[Array | np.ndarray, " dim"], t: Position
    ) -> tuple[Cache, Float[Array, " dim"]]:
        """Process the token at position `t`: `O(window + N)` work for `ssm="s4"`.

        `x_t` is `(dim,)`; returns `(cache, y_t)` with `y_t` `(dim,)`. For
        `ssm="unstruct"`, `t` must be below `init_cache`'s `max_length`.
        """
        x_t = check_features("x_t", x_t, self.self_attention.attention.dim, ndim=1)
        return _jitted_step(self, cache, x_t, _check_step(self, cache, t))

    def _step(
        self, cache: Cache, x_t: Float[Array, " dim"], t: Int[Array, ""]
    ) -> tuple[Cache, Float[Array, " dim"]]:
        h = _norm(self.attention_norm, x_t)
        frame, self_heads = _self_attention_step(self.self_attention, cache["frame"], h, t)
        ssm_state, y_t = self.ssm._step(cache["ssm"], h, t)
        context, mask = self.context.step(cache["context"], y_t, t, self.window)
        q = _heads(apply_linear(self.cross_query, h), self.num_heads)[None]
        cross = attend(q, context["k"], context["v"], mask=None if mask is None else mask[None])[0]
        out = jnp.concatenate([_merge(self_heads), _merge(cross)])
        x_t = x_t + apply_linear(self.output, out)
        cache = {"frame": frame, "ssm": ssm_state, "context": context}
        return cache, x_t + self.mlp(_norm(self.mlp_norm, x_t))

    def _prefill(
        self, x: Float[Array, "length dim"], blocks: Int[Array, ""], max_length: int
    ) -> tuple[Cache, Float[Array, "length dim"]]:
        """As `SlidingWindowLayer._prefill`."""
        h = _norm(self.attention_norm, x)
        context = self.context.init_cache(self.window, self.self_attention.attention.head_dim)
        if self.context_kind == "mf":  # the next block's context: this one's last output
            last = self.ssm.block_ends(h, self.window)[jnp.maximum(blocks - 1, 0)]
            context = {**context, "last": last.astype(context["last"].dtype)}
        cache = {
            "frame": _prefill_frame(self.self_attention, h, blocks),
            "ssm": self.ssm._prefill_state(h, self.window, blocks, max_length),
            "context": context,
        }
        return cache, self(x)


# --------------------------------------------------------------------------- BRECT


class BlockRecurrentTransformerLayer(eqx.Module):
    """Block-Recurrent Transformer layer, fixed gate, skip (BRECT:FIXED:SKIP).

    `num_states` recurrent state vectors are carried across blocks sequentially
    (`jax.lax.scan` over blocks). For block `b`:

    - tokens (vertical): `x + Out([SWA(LN x) ; CrossAttn(LN x, states_b)])`, then
      `x + MLP(LN x)`;
    - states (horizontal): with `s = LN(states_b) + state_ids`,
      `z = Out_s([Attn(s, s) ; CrossAttn(s, LN x_b)])` and the fixed gate of Hutchins et
      al. (2022), a learned, input-independent convex combination:
      `states_{b+1} = g * states_b + (1 - g) * z` with `g = sigmoid(gate_bias)` per
      feature (`gate_bias` starts at `N(0, 0.1^2)`, so `g` near 1/2, as the `"bias"`
      gate of their reference code, google-research/meliad); no MLP in this direction
      ("skip"). `states_0` is the learned `initial_state`, `N(0, 0.1^2)` at first as in
      meliad; each sequence starts from it (meliad warm-starts a document's next segment
      from the last states, a carry across training steps this layer leaves to its user).

    Keys/values are shared between directions: the tokens' keys/values serve both the
    sliding-window self-attention and the states' cross-attention; the states'
    keys/values serve both the states' self-attention and the tokens' cross-attention.
    """

    attention_norm: eqx.nn.LayerNorm
    self_attention: SlidingWindowAttention
    cross_query: eqx.nn.Linear
    output: eqx.nn.Linear
    mlp_norm: eqx.nn.LayerNorm
    mlp: _MLP
    state_norm: eqx.nn.LayerNorm
    state_attention: MultiHeadAttention
    state_cross_query: eqx.nn.Linear
    state_output: eqx.nn.Linear
    initial_state: Float[Array, "states dim"]
    state_ids: Float[Array, "states dim"]
    gate_bias: Float[Array, " dim"]
    window: int = eqx.field(static=True)
    num_heads: int = eqx.field(static=True)

    def __init__(
        self,
        dim: IntLike,
        num_heads: IntLike,
        window: IntLike,
        *,
        num_states: IntLike | None = None,
        mlp_dim: IntLike | None = None,
        attention_implementation: str | None = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: feature size; divisible by `num_heads`.
        - `num_heads`: attention heads.
        - `window`: block / window size `W`.
        - `num_states`: number of recurrent states `S` (default `window`, as in the
          paper).
        - `mlp_dim`: ReLU MLP hidden size (default `4 * dim`).
        - `attention_implementation`: the kernel of the tokens' attention in the
          parallel forward pass (sliding window and cross-attention to the states),
          `None` / `"xla"` or `"cudnn"` (see [`lineax_seq.MultiHeadAttention`][]); the
          states' update in the scan over blocks and decoding steps always use XLA.
        - `key`: PRNG key.
        """
        check_key("key", key)
        dim = check_int("dim", dim)
        window = check_window(window)
        check_implementation(attention_implementation, "attention_implementation")
        num_states = window if num_states is None else check_int("num_states", num_states)
        num_heads = check_int("num_heads", num_heads)
        keys = jr.split(key, 10)
        self.attention_norm = eqx.nn.LayerNorm(dim)
        self.self_attention = SlidingWindowAttention(
            dim,
            num_heads,
            window,
            output_projection=False,
            implementation=attention_implementation,
            key=keys[0],
        )
        self.cross_query = eqx.nn.Linear(dim, dim, key=keys[1])
        self.output = eqx.nn.Linear(2 * dim, dim, key=keys[2])
        self.mlp_norm = eqx.nn.LayerNorm(dim)
        self.mlp = _MLP(dim, _mlp_dim(dim, mlp_dim), key=keys[3])
        self.state_norm = eqx.nn.LayerNorm(dim)
        self.state_attention = MultiHeadAttention(  # attends in the scan: XLA's kernel
            dim, num_heads, output_projection=False, key=keys[4]
        )
        self.state_cross_query = eqx.nn.Linear(dim, dim, key=keys[5])
        self.state_output = eqx.nn.Linear(2 * dim, dim, key=keys[6])
        self.initial_state = 0.1 * jr.normal(keys[7], (num_states, dim))
        self.state_ids = 0.02 * jr.normal(keys[8], (num_states, dim))
        self.gate_bias = 0.1 * jr.normal(keys[9], (dim,))
        self.window = window
        self.num_heads = num_heads

    def _state_kv(self, states: Float[Array, "states dim"]):
        s = _norm(self.state_norm, states) + self.state_ids
        return s, self.state_attention.keys_values(s)

    def _update_states(self, states, s, ks, vs, k_tokens, v_tokens):
        # XLA's attention even with `attention_implementation="cudnn"`: one block's
        # (states x window) products gain little from the fused kernel, and JAX's cuDNN
        # rule under `jax.vmap` fails on the scan's first tracing pass, whose carry is
        # not yet batched while the block's keys are.
        s_self = attend(self.state_attention.queries(s), ks, vs)
        q_cross = _heads(apply_linear(self.state_cross_query, s), self.num_heads)
        s_cross = attend(q_cross, k_tokens, v_tokens)
        mixed = jnp.concatenate([_merge(s_self), _merge(s_cross)], axis=-1)
        z = apply_linear(self.state_output, mixed)
        g = jax.nn.sigmoid(self.gate_bias)
        return g * states + (1 - g) * z

    def _tokens_out(self, x, self_heads, h, ks, vs):
        q = _heads(apply_linear(self.cross_query, h), self.num_heads)
        return self._mix(x, self_heads, attend(q, ks, vs))

    @jaxtyped(typechecker=beartype)
    def __call__(
        self, x: Float[Array | np.ndarray, "length dim"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "length dim"]:
        """**Arguments:**

        - `x`: shape `(length, dim)`, `length` a multiple of `window`.
        - `key`: ignored (the layer is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        Shape `(length, dim)`.
        """
        x = jnp.asarray(x)
        check_sequence(x, self.window, self.self_attention.attention.dim)
        return _jitted_forward(self, x)[0]

    def _forward(
        self, x: Float[Array, "length dim"]
    ) -> tuple[Float[Array, "length dim"], Float[Array, "blocks states dim"]]:
        """`self(x)`, and the states after each block's update."""
        w = self.window
        mha = self.self_attention.attention
        # Everything on the token side is block-parallel: projections, the sliding-window
        # attention, the cross-attention to the states, the output projection and the MLP
        # run over the whole sequence at once (large matrix products). Only the states'
        # update is sequential: `lax.scan` over blocks carrying the states, whose step is
        # the states' own projections and their attention over one block of token keys.
        h = _norm(self.attention_norm, x)
        k, v = mha.keys_values(h)
        self_heads = self.self_attention.attend(mha.queries(h), k, v)

        def update(states, kv_b):
            s, (ks, vs) = self._state_kv(states)
            new = self._update_states(states, s, ks, vs, *kv_b)
            return new, (ks, vs, new)

        blocks = lambda a: rearrange(a, "(n w) h d -> n w h d", w=w)
        # (ks, vs)[b]: the keys/values of the states that block b's tokens read, i.e. the
        # states before block b's update.
        # The states in the dtype the update computes in (float32 for a bfloat16 layer
        # fed float32 `x`, as the token side): the scan's carry keeps one dtype.
        init = self.initial_state.astype(jnp.result_type(self.initial_state, k))
        init = varying_like(init, k)
        _, (ks, vs, after) = jax.lax.scan(update, init, (blocks(k), blocks(v)))
        q = blocks(_heads(apply_linear(self.cross_query, h), self.num_heads))
        cross = block_attention(q, ks, vs, implementation=mha.implementation)
        cross = rearrange(cross, "n w h d -> (n w) h d")
        return self._mix(x, self_heads, cross), after

    def _mix(self, x, self_heads, cross):
        mixed = jnp.concatenate([_merge(self_heads), _merge(cross)], axis=-1)
        x = x + apply_linear(self.output, mixed)
        return x + self.mlp(_norm(self.mlp_norm, x))

    def init_cache(self, max_length: IntLike) -> Cache:
        """Empty decoding cache for sequences of up to `max_length` positions (checked;
        the cache's size does not depend on it): attention frame, the recurrent states,
        and the states' normalised form and keys/values (they change once a block)."""
        check_int("max_length", max_length)
        s, (ks, vs) = self._state_kv(self.initial_state)
        states = {"states": self.initial_state, "s": s, "ks": ks, "vs": vs}
        return {"frame": _init_frame(self.self_attention), **states}

    def step(
        self, cache: Cache, x_t: Float[Array | np.ndarray, " dim"], t: Position
    ) -> tuple[Cache, Float[Array, " dim"]]:
        """Process the token at position `t`; the states update after a block's last token.

        `x_t` is `(dim,)`; returns `(cache, y_t)` with `y_t` `(dim,)`.
        """
        x_t = check_features("x_t", x_t, self.self_attention.attention.dim, ndim=1)
        return _jitted_step(self, cache, x_t, _check_step(self, cache, t))

    def _step(
        self, cache: Cache, x_t: Float[Array, " dim"], t: Int[Array, ""]
    ) -> tuple[Cache, Float[Array, " dim"]]:
        w = self.window
        h = _norm(self.attention_norm, x_t)
        frame, self_heads = _self_attention_step(self.self_attention, cache["frame"], h, t)
        states, s, ks, vs = (cache[name] for name in ("states", "s", "ks", "vs"))
        out = self._tokens_out(x_t[None], self_heads[None], h[None], ks, vs)[0]

        def block_end():
            new = self._update_states(states, s, ks, vs, frame["k"][w:], frame["v"][w:])
            new = new.astype(states.dtype)  # stored in the states' dtype, as `init_cache`
            return new, *self._state_kv(new)

        # (Kept as the updated ones vary: under `shard_map`, with the data.)
        kept = lambda: varying_like((states, s, (ks, vs)), frame["k"])
        states, s, (ks, vs) = jax.lax.cond(t % w == w - 1, block_end, kept)
        return {"frame": frame, "states": states, "s": s, "ks": ks, "vs": vs}, out

    def _prefill(
        self, x: Float[Array, "length dim"], blocks: Int[Array, ""], max_length: int
    ) -> tuple[Cache, Float[Array, "length dim"]]:
        """As `SlidingWindowLayer._prefill`."""
        y, after = _jitted_forward(self, x)
        last = after[jnp.maximum(blocks - 1, 0)].astype(self.initial_state.dtype)
        states = jnp.where(blocks > 0, last, self.initial_state)
        s, (ks, vs) = self._state_kv(states)
        h = _norm(self.attention_norm, x)
        frame = _prefill_frame(self.self_attention, h, blocks)
        return {"frame": frame, "states": states, "s": s, "ks": ks, "vs": vs}, y


# Jitted, so that an eager call compiles once per structure and shape: the scan over
# blocks and the steps' `lax.cond` take fresh closures, which eager JAX would compile anew
# on every call (a Python decoding loop paid ~0.2 s per token).
_jitted_forward = eqx.filter_jit(BlockRecurrentTransformerLayer._forward)
_jitted_step = eqx.filter_jit(lambda layer, cache, x_t, t: layer._step(cache, x_t, t))
