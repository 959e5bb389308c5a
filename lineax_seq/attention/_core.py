"""Softmax attention kernels shared by the attention modules and the BST cell."""

import math
from typing import Literal, cast

import jax
import jax.numpy as jnp
from einops import rearrange
from jaxtyping import Array, Bool, Float

from .._checks import check_choice
from .._numerics import work_dtype

IMPLEMENTATIONS = ("xla", "cudnn")


MASKED = -1e30
"""The logit of a key that a mask (or the window) leaves out."""

BIAS_FLOOR = -1e29
"""Where users' additive biases are clipped: a `-inf` bias blocks a key, yet ranks above
every masked key, so a query whose visible keys are all blocked by its bias still never
reads a masked (e.g. future) one."""


def clip_bias(bias: Float[Array, "..."]) -> Float[Array, "..."]:
    """A user's additive `bias` in float32 (float64 stays), clipped at `BIAS_FLOOR`."""
    return jnp.maximum(bias.astype(work_dtype(bias.dtype)), BIAS_FLOOR)


def check_implementation(value: object, name: str = "implementation") -> str | None:
    """`value` if it is `None`, `"xla"` or `"cudnn"`; else a `ValueError` naming `name`.

    The attention kernel of a parallel (whole-sequence) pass: `None` or `"xla"` is XLA's
    fusions, on every platform and dtype; `"cudnn"` is cuDNN's fused flash-attention
    kernel (`jax.nn.dot_product_attention(implementation="cudnn")`): NVIDIA GPUs,
    float16 / bfloat16 inputs, head size a multiple of 8, and the `(queries, keys)`
    logits are never written to memory.
    """
    check_choice(name, value, (None, *IMPLEMENTATIONS))
    return cast(str | None, value)


def fused_attention(
    q: Float[Array, "*batch q heads d"],
    k: Float[Array, "*batch k heads d"],
    v: Float[Array, "*batch k heads d"],
    bias: Float[Array, "..."] | None = None,
    mask: Bool[Array, "..."] | None = None,
    *,
    implementation: Literal["xla", "cudnn"],
) -> Float[Array, "*batch q heads d"]:
    """`jax.nn.dot_product_attention` with the given `implementation`, at most one
    leading batch axis; `bias` is cast to the inputs' dtype (cuDNN's requirement) and
    clipped at half its lowest value.

    `"cudnn"` takes float16 / bfloat16 inputs only: others raise a `TypeError` here,
    before JAX's own lowering error; where cuDNN is missing (no NVIDIA GPU), JAX's
    `RuntimeError` is raised again with the way out. Under `jax.vmap`, JAX's cuDNN rule
    takes only leading vmapped axes, so `q`, `k`, `v` are first laid out with theirs
    leading (a flatten and reshape: free without `vmap`); it also needs `q`, `k` and `v`
    all vmapped, and `bias` / `mask` not.
    """
    if implementation == "cudnn" and q.dtype not in (jnp.float16, jnp.bfloat16):
        raise TypeError(
            'implementation="cudnn" (cuDNN flash attention) needs float16 or bfloat16 '
            f'inputs, got q.dtype={q.dtype}; use implementation="xla" (or None) for it.'
        )
    if implementation == "cudnn":
        q, k, v = (jnp.ravel(a).reshape(a.shape) for a in (q, k, v))
    if bias is not None:
        # A blocked key's bias is -inf in float16: kept finite (a row of -inf is 0 / 0).
        bias = jnp.maximum(bias.astype(q.dtype), jnp.finfo(q.dtype).min / 2)
    try:
        return jax.nn.dot_product_attention(
            q, k, v, bias=bias, mask=mask, implementation=implementation
        )
    except RuntimeError as e:  # JAX checks for cuDNN as it traces the call
        if implementation != "cudnn" or "cuDNN" not in str(e):
            raise
        raise RuntimeError(
            f'implementation="cudnn" (cuDNN flash attention) cannot run here: {e} It needs '
            "an NVIDIA GPU with cuDNN; elsewhere build the model with the attention "
            'implementation "xla" (or None: implementation / attention_implementation) and '
            "load its weights into that one."
        ) from e


def masked_bias(
    mask: Bool[Array, "q k"] | Bool[Array, "heads q k"],
    bias: Float[Array, "heads q k"] | None = None,
) -> Float[Array, "#heads q k"]:
    """Fold a boolean mask, shared by the heads or per head, into an additive bias
    (`MASKED` where `mask` is `False`).

    Every query must see at least one key.
    """
    blocked = jnp.where(mask, 0.0, MASKED)
    blocked = blocked[None] if mask.ndim == 2 else blocked
    return blocked if bias is None else bias + blocked


def promote(*arrays: Array) -> tuple[Array, ...]:
    """`arrays` in their common dtype, `jnp.result_type`'s (an error under strict
    promotion if they differ), as `jnp`'s own operations take them."""
    dtype = jnp.result_type(*arrays)
    return tuple(a.astype(dtype) for a in arrays)


def head_major_attention(
    q: Float[Array, "*batch q d"],
    k: Float[Array, "*batch k d"],
    v: Float[Array, "*batch k d"],
    bias: Float[Array, "*#batch #q #k"] | None = None,
    mask: Bool[Array, "*#batch #q #k"] | None = None,
) -> Float[Array, "*batch q d"]:
    """Softmax attention with leading batch axes (e.g. `(heads, blocks)`).

    `q`, `k` and `v` are first promoted to one dtype, as `jnp` operations promote (an
    error under strict promotion). Logits and the softmax are float32, or float64 for
    float64 inputs (the outputs are cast back to the inputs' dtype);
    normalisation happens after the value product, on `(q, d)` instead of `(q, k)`.
    `bias` is additive (`MASKED` blocks a key); `mask` (`False` blocks a key) replaces the
    blocked logits, as `jax.nn.dot_product_attention` does, so a query that sees no key
    gets the plain mean of the values and no gradient through its logits.
    """
    q, k, v = promote(q, k, v)
    acc = work_dtype(q.dtype)
    scale = jnp.asarray(1 / math.sqrt(q.shape[-1]), q.dtype)
    logits = jnp.einsum("...qd,...kd->...qk", q * scale, k, preferred_element_type=acc)
    if bias is not None:
        logits = logits + bias.astype(acc)
    if mask is not None:
        logits = jnp.where(mask, logits, MASKED)
    # (`initial`: no keys at all, as in self-attention over an empty sequence, is fine.)
    weights = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True, initial=-jnp.inf))
    out = jnp.einsum("...qk,...kd->...qd", weights.astype(v.dtype), v, preferred_element_type=acc)
    return (out / jnp.sum(weights, axis=-1, keepdims=True)).astype(v.dtype)


def attend(
    q: Float[Array, "*batch q heads d"],
    k: Float[Array, "*batch k heads d"],
    v: Float[Array, "*batch k heads d"],
    *,
    bias: Float[Array, "..."] | None = None,
    mask: Bool[Array, "..."] | None = None,
    implementation: str | None = None,
) -> Float[Array, "*batch q heads d"]:
    """`jax.nn.dot_product_attention` for float32 inputs (`q`, `k` and `v` promoted to
    one dtype first, as `jnp` operations promote). Other dtypes go to
    `head_major_attention`: float64 is computed in float64 throughout; float16 there
    asks for a product XLA's CPU backend cannot compile, and bfloat16 one that mixes
    dtypes (an error under strict dtype promotion). `bias` and `mask` broadcast to
    `(*batch, heads, q, k)`, as there; `implementation` as in
    [`lineax_seq.MultiHeadAttention`][]."""
    q, k, v = promote(q, k, v)
    if implementation == "cudnn":
        return fused_attention(q, k, v, bias, mask, implementation="cudnn")
    if q.dtype == jnp.float32:
        bias = None if bias is None else bias.astype(q.dtype)
        return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask)
    hm = lambda a: rearrange(a, "... t h d -> ... h t d")
    out = head_major_attention(hm(q), hm(k), hm(v), bias, mask)
    return rearrange(out, "... h t d -> ... t h d")
