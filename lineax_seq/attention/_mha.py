"""Multi-head (self- and cross-) attention on `jax.nn.dot_product_attention`."""

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from beartype import beartype
from einops import rearrange
from jaxtyping import Array, Bool, Float, PRNGKeyArray, jaxtyped

from .._checks import IntLike, as_arrays, check_bool, check_float_dtype, check_int, check_key
from .._nn import apply_linear
from ._core import attend, check_implementation, clip_bias


class MultiHeadAttention(eqx.Module):
    """Multi-head attention with optional cross-attention, masks and additive bias.

    Queries come from `x` (`dim` features); keys and values from `context` (`kv_dim`
    features, default `dim`), or from `x` itself for self-attention. The attention
    itself is XLA's softmax attention with float32 logits (`jax.nn.dot_product_attention`
    for float32 inputs; for float16 / bfloat16 the same computation written out, which
    compiles on every backend), or cuDNN's fused flash-attention kernel with
    `implementation="cudnn"` (NVIDIA GPUs, float16 / bfloat16 inputs); float64 inputs are
    computed in float64 throughout.

    The projections are also available one by one (`queries`, `keys_values`,
    `merge_heads`) for layers that arrange heads themselves (sliding-window blocks, the
    Block-State Transformer cell).
    """

    query_proj: eqx.nn.Linear
    key_proj: eqx.nn.Linear
    value_proj: eqx.nn.Linear
    output_proj: eqx.nn.Linear | None
    dim: int = eqx.field(static=True)
    num_heads: int = eqx.field(static=True)
    kv_dim: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)
    implementation: str | None = eqx.field(static=True)

    def __init__(
        self,
        dim: IntLike,
        num_heads: IntLike,
        *,
        kv_dim: IntLike | None = None,
        use_bias: bool = False,
        output_projection: bool = True,
        implementation: str | None = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: query (and output) feature size; must be divisible by `num_heads`.
        - `num_heads`: number of heads, each of size `dim // num_heads`.
        - `kv_dim`: feature size of the cross-attention `context` (default `dim`).
        - `use_bias`: whether the projections have biases.
        - `output_projection`: if `False`, `__call__` returns the concatenated heads
          without the final `dim x dim` projection (for layers that mix several
          attention outputs with one projection).
        - `implementation`: the attention kernel: `None` or `"xla"` (XLA, any platform
          and dtype), or `"cudnn"` (cuDNN flash attention: NVIDIA GPUs, float16 /
          bfloat16 inputs, `dim // num_heads` a multiple of 8; under `jax.vmap`, JAX's
          cuDNN rule needs `x` and `context` both vmapped and `mask` / `bias` shared by
          the batch). A static choice: to run a trained model with another kernel,
          build one with it and load the weights (`eqx.tree_deserialise_leaves`).
        - `key`: PRNG key for the initialisation.
        """
        check_key("key", key)
        dim = check_int("dim", dim)
        num_heads = check_int("num_heads", num_heads)
        if dim % num_heads:
            raise ValueError(
                f"`num_heads`={num_heads} must divide `dim`={dim} (head size dim // num_heads)."
            )
        kv_dim = dim if kv_dim is None else check_int("kv_dim", kv_dim)
        check_bool("use_bias", use_bias)
        check_bool("output_projection", output_projection)
        implementation = check_implementation(implementation)
        kq, kk, kv, ko = jr.split(key, 4)
        self.query_proj = eqx.nn.Linear(dim, dim, use_bias=use_bias, key=kq)
        self.key_proj = eqx.nn.Linear(kv_dim, dim, use_bias=use_bias, key=kk)
        self.value_proj = eqx.nn.Linear(kv_dim, dim, use_bias=use_bias, key=kv)
        self.output_proj = (
            eqx.nn.Linear(dim, dim, use_bias=use_bias, key=ko) if output_projection else None
        )
        self.dim = dim
        self.num_heads = num_heads
        self.kv_dim = kv_dim
        self.head_dim = dim // num_heads
        self.implementation = implementation

    def queries(self, x: Float[Array | np.ndarray, "q dim"]) -> Float[Array, "q heads head_dim"]:
        """Project `x` `(q, dim)` to per-head queries `(q, heads, head_dim)`."""
        x = _checked("x", x, (self.dim,), f"length, dim={self.dim}")
        return rearrange(apply_linear(self.query_proj, x), "q (h d) -> q h d", h=self.num_heads)

    def keys_values(
        self, context: Float[Array | np.ndarray, "k kv_dim"]
    ) -> tuple[Float[Array, "k heads head_dim"], Float[Array, "k heads head_dim"]]:
        """Project `context` `(k, kv_dim)` to keys and values, each `(k, heads, head_dim)`."""
        context = _checked("context", context, (self.kv_dim,), f"length, kv_dim={self.kv_dim}")
        k = rearrange(apply_linear(self.key_proj, context), "k (h d) -> k h d", h=self.num_heads)
        v = rearrange(apply_linear(self.value_proj, context), "k (h d) -> k h d", h=self.num_heads)
        return k, v

    def merge_heads(
        self, out: Float[Array | np.ndarray, "q heads head_dim"]
    ) -> Float[Array, "q dim"]:
        """Concatenate heads `out` `(q, heads, head_dim)` and apply the output projection:
        `(q, dim)`."""
        out = _checked(
            "out", out, (self.num_heads, self.head_dim), f"q, {self.num_heads}, {self.head_dim}"
        )
        out = rearrange(out, "q h d -> q (h d)")
        return out if self.output_proj is None else apply_linear(self.output_proj, out)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        x: Float[Array | np.ndarray, "q dim"],
        context: Float[Array | np.ndarray, "k kv_dim"] | None = None,
        *,
        mask: Bool[Array | np.ndarray, "q k"] | Bool[Array | np.ndarray, "heads q k"] | None = None,
        bias: Float[Array | np.ndarray, "q k"]
        | Float[Array | np.ndarray, "heads q k"]
        | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "q dim"]:
        """Attend from `x` to `context` (or to `x` itself).

        **Arguments:**

        - `x`: queries' inputs, shape `(q, dim)`.
        - `context`: keys'/values' inputs, shape `(k, kv_dim)`, `k >= 1` if `q >= 1`; `None`
          means `x` (self-attention, which needs `kv_dim == dim`).
        - `mask`: boolean, `True` where a query may attend to a key; shape `(q, k)` or
          `(heads, q, k)`. Every query should see at least one key: a query that sees
          none gets the plain mean of all values (its logits are all masked alike).
        - `bias`: additive logit bias, shape `(q, k)` (shared by the heads) or
          `(heads, q, k)` (e.g. from [`lineax_seq.RelativePositionBias`][]); `-inf`
          blocks a key, but never lets in one that `mask` leaves out: a query whose
          visible keys are all blocked by `-inf` gets the mean of their values, not NaN.
        - `key`: ignored (the layer is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        Shape `(q, dim)`, in the dtype of the inputs and weights promoted together (as
        `eqx.nn.Linear`'s output: float32 for bfloat16 inputs to float32 weights).
        """
        x, context, mask, bias = as_arrays(x, context, mask, bias)
        x = _checked("x", x, (self.dim,), f"length, dim={self.dim}")
        if context is None and self.kv_dim != self.dim:
            raise ValueError(
                f"self-attention (no `context`) needs kv_dim == dim, but this layer has "
                f"kv_dim={self.kv_dim} and dim={self.dim}: pass the keys' and values' "
                "`context`."
            )
        if context is None:
            context = x
        else:
            context = _checked("context", context, (self.kv_dim,), f"length, kv_dim={self.kv_dim}")
            if context.shape[0] == 0 and x.shape[0]:
                raise ValueError(
                    f"`context` must hold at least one key, got shape {context.shape}."
                )
        if mask is not None and mask.dtype != bool:
            # (Other dtypes would be read as truthy: an additive 0 / -inf mask, inverted.)
            raise TypeError(
                "`mask` must be boolean (True where a query may attend to a key), got "
                f"mask.dtype={mask.dtype}."
            )
        q_k = (x.shape[0], context.shape[0])
        for name, value in (("mask", mask), ("bias", bias)):
            if value is not None and value.shape[-2:] != q_k:
                raise ValueError(
                    f"`{name}` must end in (queries, keys)={q_k}, got shape {value.shape}."
                )
            if value is not None and value.ndim == 3 and value.shape[0] != self.num_heads:
                raise ValueError(
                    f"`{name}` must have num_heads={self.num_heads} heads on its first "
                    f"axis, got shape {value.shape}."
                )
        if bias is not None:
            # -inf kept finite (a row of -inf would make the softmax 0 / 0), and above
            # the masked keys' logits (see `clip_bias`).
            bias = clip_bias(bias)
        q = self.queries(x)
        k, v = self.keys_values(context)
        out = attend(q, k, v, bias=bias, mask=mask, implementation=self.implementation)
        return self.merge_heads(out)


def _checked(name: str, a: object, features: tuple[int, ...], shape: str) -> Array:
    """`a` as an array of shape `(length, *features)` (described by `shape`) with a
    floating dtype, or an error naming `name` (one example: a batch is `jax.vmap`'s)."""
    a = jnp.asarray(a)
    if a.shape[1:] != features:
        raise ValueError(
            f"`{name}` must have shape ({shape}) (one example: jax.vmap over a batch), got "
            f"shape {a.shape}."
        )
    check_float_dtype(name, a)
    return a
