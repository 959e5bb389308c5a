"""Causal sliding-window attention computed block by block, all blocks at once."""

from typing import Literal

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from beartype import beartype
from einops import rearrange
from jaxtyping import Array, Bool, Float, PRNGKeyArray, jaxtyped

from .._checks import IntLike, as_array, check_int, check_key
from ._bias import RelativePositionBias
from ._core import (
    MASKED,
    check_implementation,
    clip_bias,
    fused_attention,
    head_major_attention,
    masked_bias,
    promote,
)
from ._mha import MultiHeadAttention


def check_sequence(x: Array, window: int, dim: int) -> None:
    """A `ValueError` unless `x` is `(length, dim)` with `length` a multiple of `window`
    (one example: a batch is `jax.vmap`'s)."""
    if x.ndim != 2 or x.shape[-1] != dim:
        raise ValueError(
            f"`x` must have shape (length, dim={dim}) (one example: jax.vmap over a batch), "
            f"got shape {x.shape}."
        )
    check_blocks(x.shape[0], window)


def check_window(window: object) -> int:
    """`window` as an `int` (NumPy integers accepted), or a clear error."""
    return check_int("window", window)


def check_blocks(length: int, window: IntLike, name: str = "x") -> int:
    """Return the number of blocks of `window` in `length`, or raise a clear error."""
    window = check_window(window)
    if length < window:
        raise ValueError(
            f"`window`={window} is larger than the sequence length {length} of `{name}`."
        )
    if length % window:
        raise ValueError(
            f"The sequence length {length} of `{name}` must be a multiple of "
            f"`window`={window} (pad it, or use {length - length % window} or "
            f"{length + window - length % window})."
        )
    return length // window


def sliding_window_mask(window: IntLike) -> Bool[Array, "w 2*w"]:
    """Which keys of `[previous block, current block]` each query sees: `(window, 2 * window)`.

    Query `r` of a block sits at frame position `window + r`; key `c` (frame position
    `c`) is visible iff `0 <= (window + r) - c < window`: the query itself and the
    `window - 1` tokens before it. (The Block-Recurrent Transformer's code,
    google-research/meliad, shows each query the `window` tokens before it and not
    itself, with a cache of zeros before a document's first token; with the query
    itself, the first token of a sequence has a key to attend to.)

    **Arguments:**

    - `window`: the block size `W`, a positive integer.

    **Returns:**

    A boolean array of shape `(window, 2 * window)`, True where the query (row) may
    attend to the key (column).
    """
    window = check_window(window)
    r = jnp.arange(window)[:, None]
    c = jnp.arange(2 * window)[None, :]
    return (c > r) & (c <= window + r)


def sliding_window_attention(
    q: Float[Array | np.ndarray, "length heads head_dim"],
    k: Float[Array | np.ndarray, "length heads head_dim"],
    v: Float[Array | np.ndarray, "length heads head_dim"],
    *,
    window: IntLike,
    bias: Float[Array | np.ndarray, "heads w 2*w"] | None = None,
    implementation: str | None = None,
) -> Float[Array, "length heads head_dim"]:
    """Causal sliding-window attention, batched over blocks of `window` tokens.

    The sequence is cut into `length / window` blocks. Each block's queries attend to
    the keys/values of the previous block and of their own block (a differentiable
    cache, as in Transformer-XL / Block-Recurrent Transformers) under a mask that lets
    token `i` see tokens `i - window + 1, ..., i`: every token sees the `window` most
    recent tokens. All blocks are computed at once, as batched matrix products over
    `(heads, blocks)` (queries `(window, head_dim)` against a `(2 * window, head_dim)`
    key frame), so the cost is `O(length * window)` and nothing of size
    `(length, length)` is built. `q`, `k` and `v` of different dtypes are promoted to one,
    as `jnp` operations promote them; logits and the softmax are computed in float32
    (float64 for float64 inputs).

    With `implementation="cudnn"` (NVIDIA GPUs, float16 / bfloat16) the blocks are the
    batch of cuDNN's fused flash-attention kernel, which never writes the
    `(heads, blocks, window, 2 * window)` logits to memory.

    **Arguments:**

    - `q`, `k`, `v`: per-head queries, keys and values, shape `(length, heads, head_dim)`
      (JAX or NumPy arrays, as is `bias`).
    - `window`: the block size `W`; `length` must be a multiple of it.
    - `bias`: additive bias for the `(window, 2 * window)` block frame (queries at frame
      positions `window .. 2*window - 1`), e.g.
      `RelativePositionBias(...)(window, 2 * window, query_offset=window)`; `-inf`
      blocks a key, never letting in one outside the window.
    - `implementation`: `None` or `"xla"` (XLA, any platform), or `"cudnn"`; see
      [`lineax_seq.MultiHeadAttention`][].

    **Returns:**

    Attention outputs, shape `(length, heads, head_dim)`.
    """
    q, k, v = as_array("q", q), as_array("k", k), as_array("v", v)
    bias = as_array("bias", bias, optional=True)
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            raise TypeError(f"`{name}` must have a floating dtype, got {name}.dtype={a.dtype}.")
    q, k, v = promote(q, k, v)
    if q.ndim != 3:
        raise ValueError(
            f"`q`, `k` and `v` must have shape (length, heads, head_dim), got q.shape={q.shape}."
        )
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"`q`, `k` and `v` must have one shape (length, heads, head_dim), got "
            f"q.shape={q.shape}, k.shape={k.shape}, v.shape={v.shape}."
        )
    num_blocks = check_blocks(q.shape[0], window, "q")
    expected = (q.shape[1], window, 2 * window)
    if bias is not None and bias.shape != expected:
        raise ValueError(
            f"`bias` must have shape (heads, window, 2 * window)={expected}, "
            f"got shape {bias.shape}."
        )
    bias = None if bias is None else clip_bias(bias)  # -inf: blocked, above the window's
    if check_implementation(implementation) == "cudnn":
        return _frame_attention(q, k, v, window, bias, implementation="cudnn")
    # Head-major blocks: (heads, blocks, w, d). The batched products then have their
    # batch axes leading and contract the minor axis: plain GEMMs, no transposes inside.
    q, k, v = (rearrange(a, "(n w) h d -> h n w d", w=window) for a in (q, k, v))
    previous = lambda a: jnp.concatenate([jnp.zeros_like(a[:, :1]), a[:, :-1]], axis=1)
    k_frame = jnp.concatenate([previous(k), k], axis=2)  # (h, n, 2w, d): [previous; own]
    v_frame = jnp.concatenate([previous(v), v], axis=2)
    # The window mask is the same for every block, so it is folded into one additive
    # (heads, w, 2w) bias; block 0 has no previous block, so the first half of its frame
    # is blocked by a (blocks, 2w) term. Both broadcast inside the softmax's loop.
    frame_bias = masked_bias(sliding_window_mask(window), bias)[:, None]
    no_previous = (jnp.arange(num_blocks)[:, None] == 0) & (jnp.arange(2 * window) < window)
    frame_bias = frame_bias + jnp.where(no_previous, MASKED, 0.0)[None, :, None]
    out = head_major_attention(q, k_frame, v_frame, frame_bias)
    return rearrange(out, "h n w d -> (n w) h d")


def _frame_attention(
    q: Float[Array, "length heads head_dim"],
    k: Float[Array, "length heads head_dim"],
    v: Float[Array, "length heads head_dim"],
    window: IntLike,
    bias: Float[Array, "heads w 2*w"] | None,
    *,
    implementation: Literal["xla", "cudnn"],
) -> Float[Array, "length heads head_dim"]:
    """`sliding_window_attention` by `jax.nn.dot_product_attention`, blocks as its batch.

    Block 0 has no previous block: it attends to its own keys alone, in a call of its
    own, so that the other blocks share one `(heads, window, 2 * window)` bias and mask.
    """
    blocks = lambda a: rearrange(a, "(n w) h d -> n w h d", w=window)
    q, k, v = blocks(q), blocks(k), blocks(v)
    mask = sliding_window_mask(window)[None, None]
    bias = None if bias is None else bias[None]
    own = lambda a: None if a is None else a[..., window:]
    out = fused_attention(q[:1], k[:1], v[:1], own(bias), own(mask), implementation=implementation)
    if q.shape[0] > 1:
        frame = lambda a: jnp.concatenate([a[:-1], a[1:]], axis=1)  # [previous; own]
        rest = fused_attention(q[1:], frame(k), frame(v), bias, mask, implementation=implementation)
        out = jnp.concatenate([out, rest])
    return rearrange(out, "n w h d -> (n w) h d")


def block_attention(
    q: Float[Array, "blocks q heads d"],
    k: Float[Array, "blocks k heads d"],
    v: Float[Array, "blocks k heads d"],
    bias: Float[Array, "#heads q k"] | None = None,
    mask: Bool[Array, "q k"] | None = None,
    implementation: str | None = None,
) -> Float[Array, "blocks q heads d"]:
    """Multi-head softmax attention batched over blocks (each block its own keys).

    The same computation as `jax.nn.dot_product_attention` with the blocks as the batch
    axis. XLA's path lays it out head-major so every block/head pair is one plain matrix
    product; `implementation="cudnn"` runs cuDNN's fused kernel on the blocks.
    """
    if check_implementation(implementation) == "cudnn":
        bias = None if bias is None else bias[None]
        mask = None if mask is None else mask[None, None]
        return fused_attention(q, k, v, bias, mask, implementation="cudnn")
    if mask is not None:
        bias = masked_bias(mask, bias)
    hm = lambda a: rearrange(a, "n t h d -> h n t d")
    out = head_major_attention(hm(q), hm(k), hm(v), None if bias is None else bias[:, None])
    return rearrange(out, "h n t d -> n t h d")


class SlidingWindowAttention(eqx.Module):
    """Causal sliding-window self-attention with a T5 relative position bias.

    Every token attends to itself and the `window - 1` tokens before it; the work is
    done block-parallel by [`lineax_seq.sliding_window_attention`][].
    """

    attention: MultiHeadAttention
    relative_bias: RelativePositionBias
    window: int = eqx.field(static=True)

    def __init__(
        self,
        dim: IntLike,
        num_heads: IntLike,
        window: IntLike,
        *,
        num_buckets: IntLike = 32,
        max_distance: IntLike = 128,
        output_projection: bool = True,
        implementation: str | None = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: feature size; divisible by `num_heads`.
        - `num_heads`: number of heads.
        - `window`: block / window size `W`.
        - `num_buckets`, `max_distance`: of the relative position bias.
        - `output_projection`, `implementation`: as in [`lineax_seq.MultiHeadAttention`][].
        - `key`: PRNG key.
        """
        check_key("key", key)
        window = check_window(window)
        ka, kb = jr.split(key)
        self.attention = MultiHeadAttention(
            dim,
            num_heads,
            output_projection=output_projection,
            implementation=implementation,
            key=ka,
        )
        self.relative_bias = RelativePositionBias(
            num_heads, num_buckets=num_buckets, max_distance=max_distance, key=kb
        )
        self.window = window

    def heads(
        self, x: Float[Array | np.ndarray, "length dim"]
    ) -> Float[Array, "length heads head_dim"]:
        """Per-head outputs `(length, heads, head_dim)` of `x` `(length, dim)`, before
        merging; `length` a multiple of `window`."""
        x = jnp.asarray(x)
        check_sequence(x, self.window, self.attention.dim)
        k, v = self.attention.keys_values(x)
        return self.attend(self.attention.queries(x), k, v)

    def attend(
        self,
        q: Float[Array, "length heads head_dim"],
        k: Float[Array, "length heads head_dim"],
        v: Float[Array, "length heads head_dim"],
    ) -> Float[Array, "length heads head_dim"]:
        """Sliding-window attention of projected queries/keys/values, with this bias.

        `q`, `k`, `v` and the output are `(length, heads, head_dim)`.
        """
        bias = self.relative_bias(self.window, 2 * self.window, query_offset=self.window)
        return sliding_window_attention(
            q, k, v, window=self.window, bias=bias, implementation=self.attention.implementation
        )

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
        return self.attention.merge_heads(self.heads(x))
