"""Causal sliding-window attention computed block by block, all blocks at once."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from beartype import beartype
from einops import rearrange
from jaxtyping import Array, Bool, Float, PRNGKeyArray, jaxtyped

from ._bias import RelativePositionBias
from ._mha import MultiHeadAttention


def check_blocks(length: int, window: int, name: str = "x") -> int:
    """Return the number of blocks of `window` in `length`, or raise a clear error."""
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


def sliding_window_mask(window: int) -> Bool[Array, "w 2*w"]:
    """Which keys of `[previous block, current block]` each query of a block sees.

    Query `r` of a block sits at frame position `window + r`; key `c` (frame position
    `c`) is visible iff `0 <= (window + r) - c < window`: the query itself and the
    `window - 1` tokens before it.
    """
    r = jnp.arange(window)[:, None]
    c = jnp.arange(2 * window)[None, :]
    return (c > r) & (c <= window + r)


def masked_bias(
    mask: Bool[Array, "q k"], bias: Float[Array, "heads q k"] | None = None
) -> Float[Array, "#heads q k"]:
    """Fold a boolean mask into an additive bias (`-1e30` where `mask` is `False`).

    Every query must see at least one key.
    """
    blocked = jnp.where(mask, 0.0, -1e30)[None]
    return blocked if bias is None else bias + blocked


def sliding_window_attention(
    q: Float[Array, "length heads head_dim"],
    k: Float[Array, "length heads head_dim"],
    v: Float[Array, "length heads head_dim"],
    *,
    window: int,
    bias: Float[Array, "heads w 2*w"] | None = None,
) -> Float[Array, "length heads head_dim"]:
    """Causal sliding-window attention, batched over blocks of `window` tokens.

    The sequence is cut into `length / window` blocks. Each block's queries attend to
    the keys/values of the previous block and of their own block (a differentiable
    cache, as in Transformer-XL / Block-Recurrent Transformers) under a mask that lets
    token `i` see tokens `i - window + 1, ..., i`: every token sees the `window` most
    recent tokens. All blocks go through `jax.nn.dot_product_attention` with the blocks
    as the batch axis (block 0, which has no previous block, in a call of its own), so
    the cost is `O(length * window)` and nothing of size `(length, length)` is built.

    **Arguments:**

    - `q`, `k`, `v`: per-head queries, keys and values, shape `(length, heads, head_dim)`.
    - `window`: the block size `W`; `length` must be a multiple of it.
    - `bias`: additive bias for the `(window, 2 * window)` block frame (queries at frame
      positions `window .. 2*window - 1`), e.g.
      `RelativePositionBias(...)(window, 2 * window, query_offset=window)`.

    **Returns:**

    Attention outputs, shape `(length, heads, head_dim)`.
    """
    num_blocks = check_blocks(q.shape[0], window, "q")
    q, k, v = (rearrange(a, "(n w) h d -> n w h d", w=window) for a in (q, k, v))
    # The window mask is the same for every block, so it is folded into one additive
    # (heads, w, 2w) bias: no per-block boolean mask is built or applied (on CPU the
    # masking pass costs about a fifth of the attention). Block 0 has no previous block:
    # it attends to its own keys only, with the causal half of the same bias.
    frame_bias = masked_bias(sliding_window_mask(window), bias)
    first = jax.nn.dot_product_attention(q[:1], k[:1], v[:1], bias=frame_bias[None, :, :, window:])
    if num_blocks == 1:
        return first[0]
    k_frame = jnp.concatenate([k[:-1], k[1:]], axis=1)  # (n - 1, 2w, h, d): [previous; own]
    v_frame = jnp.concatenate([v[:-1], v[1:]], axis=1)
    rest = jax.nn.dot_product_attention(q[1:], k_frame, v_frame, bias=frame_bias[None])
    return rearrange(jnp.concatenate([first, rest]), "n w h d -> (n w) h d")


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
        dim: int,
        num_heads: int,
        window: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        output_projection: bool = True,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: feature size; divisible by `num_heads`.
        - `num_heads`: number of heads.
        - `window`: block / window size `W`.
        - `num_buckets`, `max_distance`: of the relative position bias.
        - `output_projection`: as in [`lineax_seq.MultiHeadAttention`][].
        - `key`: PRNG key.
        """
        if window < 1:
            raise ValueError(f"`window` must be >= 1, got {window}.")
        ka, kb = jr.split(key)
        self.attention = MultiHeadAttention(
            dim, num_heads, output_projection=output_projection, key=ka
        )
        self.relative_bias = RelativePositionBias(
            num_heads, num_buckets=num_buckets, max_distance=max_distance, key=kb
        )
        self.window = window

    def heads(self, x: Float[Array, "length dim"]) -> Float[Array, "length heads head_dim"]:
        """Per-head attention outputs before merging heads."""
        q = self.attention.queries(x)
        k, v = self.attention.keys_values(x)
        bias = self.relative_bias(self.window, 2 * self.window, query_offset=self.window)
        return sliding_window_attention(q, k, v, window=self.window, bias=bias)

    @jaxtyped(typechecker=beartype)
    def __call__(self, x: Float[Array, "length dim"]) -> Float[Array, "length dim"]:
        """**Arguments:**

        - `x`: shape `(length, dim)`, `length` a multiple of `window`.

        **Returns:**

        Shape `(length, dim)`.
        """
        if x.shape[-1] != self.attention.dim:
            raise ValueError(
                f"`x` must have dim={self.attention.dim} features, got shape {x.shape}."
            )
        check_blocks(x.shape[0], self.window)
        return self.attention.merge_heads(self.heads(x))
