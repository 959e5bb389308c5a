"""Task heads on top of the encoder's hidden states (one example at a time)."""

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from beartype import beartype
from jaxtyping import Array, Bool, Float, PRNGKeyArray, jaxtyped

from .._checks import (
    IntLike,
    RealScalar,
    as_array,
    as_arrays,
    check_bool,
    check_int,
    check_key,
    check_mask_dtype,
)
from .._nn import apply_linear
from .._numerics import work_dtype
from ._layers import (
    INIT_STD,
    apply_dropout,
    apply_norm,
    check_dropout,
    check_init_std,
    dense,
    resolve_inference,
)


def _check_hidden(
    x: Array, dim: int | Literal["scalar"], axes: tuple[str, ...], mask: Array | None = None
) -> None:
    """A `ValueError` unless `x` is `(*axes, dim)` with every axis `>= 1` and `mask` (if
    any) `x.shape[:-1]` (a mask of length 1 would broadcast silently), a `TypeError`
    unless `mask` is boolean."""
    if x.ndim != len(axes) + 1 or x.shape[-1] != dim or 0 in x.shape[:-1]:
        shape = ", ".join(f"{axis} >= 1" for axis in axes)
        raise ValueError(f"x must have shape ({shape}, dim={dim}), got x.shape={x.shape}")
    check_mask_dtype(mask)
    if mask is not None and mask.shape != x.shape[:-1]:
        raise ValueError(f"mask must have shape {x.shape[:-1]} like x, got mask.shape={mask.shape}")


def masked_mean(
    x: Float[Array | np.ndarray, "length dim"],
    mask: Bool[Array | np.ndarray, " length"] | None = None,
) -> Float[Array, " dim"]:
    """Mean of `x` over the real positions (`mask == True`; all of them if `mask` is None).

    **Arguments:**

    - `x`: shape `(length, dim)`, `length >= 1` (a JAX or NumPy array).
    - `mask`: optional, shape `(length,)`, `True` at real tokens (a JAX or NumPy array).

    **Returns:**

    Shape `(dim,)` (zero if no position is real), in `x`'s dtype (half precision is
    summed in float32, as `jnp.mean` does).
    """
    x, mask = as_array("x", x), as_array("mask", mask, optional=True)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"x must have shape (length >= 1, dim), got x.shape={x.shape}")
    if mask is None:
        return jnp.mean(x, axis=0)
    if mask.shape != x.shape[:1]:
        raise ValueError(f"mask must have shape {x.shape[:1]} like x, got mask.shape={mask.shape}")
    check_mask_dtype(mask)
    # Summed in at least float32, as `jnp.mean` does (a float16 sum overflows).
    wide = work_dtype(x.dtype)
    total = jnp.sum(jnp.where(mask[:, None], x, 0).astype(wide), axis=0)
    return (total / jnp.maximum(jnp.sum(mask), 1).astype(wide)).astype(x.dtype)


class MaskedLMHead(eqx.Module):
    """Masked-LM head: `logits = LN(gelu(W h + b)) E^T + bias`, with the decoder `E` tied
    to the token embedding (BERT's; the default) or a matrix of its own (`tied=False`).
    The GELU is the exact one, as in BERT's head and the reference implementation's (whose
    layers use the tanh approximation, as [`lineax_seq.GatedLayer`][] does)."""

    transform: eqx.nn.Linear
    norm: eqx.nn.LayerNorm
    bias: Float[Array, " vocab"]
    decoder: Float[Array, "vocab dim"] | None

    def __init__(
        self,
        dim: IntLike,
        vocab_size: IntLike,
        *,
        tied: bool = True,
        init_std: RealScalar = INIT_STD,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: hidden size.
        - `vocab_size`: vocabulary size (rows of the decoder).
        - `tied`: if `True` (BERT's), the decoder is the token embedding, passed at call
            time; if `False`, the head owns a `(vocab_size, dim)` decoder.
        - `init_std`: std of the truncated-normal weights (BERT's 0.02).
        - `key`: a `jax.random.key`.
        """
        check_key("key", key)
        dim = check_int("dim", dim)
        vocab_size = check_int("vocab_size", vocab_size)
        tied = check_bool("tied", tied)
        init_std = check_init_std(init_std)
        self.transform = dense(dim, dim, std=init_std, key=key)
        self.norm = eqx.nn.LayerNorm(dim, eps=1e-6)
        self.bias = jnp.zeros((vocab_size,))
        self.decoder = (
            None
            if tied
            else init_std * jr.truncated_normal(jr.fold_in(key, 1), -2.0, 2.0, (vocab_size, dim))
        )

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        x: Float[Array | np.ndarray, "n dim"],
        embedding: Float[Array | np.ndarray, "vocab embedding_dim"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "n vocab"]:
        """Vocabulary logits.

        **Arguments:**

        - `x`: hidden states, shape `(n, dim)` (all positions, or only the masked ones).
        - `embedding`: the tied token embedding, shape `(vocab, dim)`, e.g.
            `model.token_embedding.weight`; required by a tied head, refused by an untied
            one.
        - `key`: ignored (the head is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        Shape `(n, vocab)`.
        """
        x, embedding = as_arrays(x, embedding)
        dim = self.transform.in_features
        _check_hidden(x, dim, ("n",))
        if self.decoder is not None:
            if embedding is not None:
                raise ValueError(
                    "embedding must be None for an untied head (tied=False: it has its own "
                    f"decoder), got embedding.shape={embedding.shape}"
                )
            embedding = self.decoder
        elif embedding is None:
            raise ValueError(
                "embedding is required: this head's decoder is tied to the token embedding "
                "(pass e.g. model.token_embedding.weight, or build the head with tied=False)"
            )
        elif embedding.shape != (self.bias.shape[0], dim):
            raise ValueError(
                f"embedding must have shape (vocab_size, dim)={(self.bias.shape[0], dim)}, "
                f"got embedding.shape={embedding.shape}"
            )
        h = apply_norm(self.norm, jax.nn.gelu(apply_linear(self.transform, x), approximate=False))
        return h @ embedding.T + self.bias


class SequenceClassificationHead(eqx.Module):
    """Classification / regression head: mean over real tokens, dense, tanh, dropout,
    dense. `num_outputs` classes (logits), or 1 for regression."""

    pooler: eqx.nn.Linear
    dropout: eqx.nn.Dropout
    classifier: eqx.nn.Linear
    dropout_rate: float = eqx.field(static=True)

    def __init__(
        self,
        dim: IntLike,
        num_outputs: IntLike,
        *,
        dropout: RealScalar = 0.0,
        init_std: RealScalar = INIT_STD,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: hidden size.
        - `num_outputs`: number of classes (1 for regression).
        - `dropout`: dropout rate before the last dense layer (the paper fine-tunes
            with 0.1).
        - `init_std`: std of the truncated-normal weights (BERT's 0.02).
        - `key`: a `jax.random.key`.
        """
        check_key("key", key)
        dim = check_int("dim", dim)
        num_outputs = check_int("num_outputs", num_outputs)
        dropout = check_dropout(dropout)  # a Python float: a static rate, never trained
        init_std = check_init_std(init_std)
        pool_key, cls_key = jr.split(key)
        self.pooler = dense(dim, dim, std=init_std, key=pool_key)
        self.dropout = eqx.nn.Dropout(dropout)
        self.classifier = dense(dim, num_outputs, std=init_std, key=cls_key)
        self.dropout_rate = dropout

    @property
    def num_outputs(self) -> int:
        """The number of outputs: the classifier's (so it follows an `eqx.tree_at` that
        swaps the classifier; an `eqx.filter_vmap` ensemble's heads give theirs)."""
        return self.classifier.weight.shape[-2]

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        x: Float[Array | np.ndarray, "length dim"],
        mask: Bool[Array | np.ndarray, " length"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> Float[Array, " {self.num_outputs}"]:
        """Predict from one sequence.

        **Arguments:**

        - `x`: hidden states, shape `(length, dim)`.
        - `mask`: optional, shape `(length,)`, `True` at real tokens; only they are pooled.
        - `key`: dropout key.
        - `inference`: disable dropout; `None` (default) defers to the dropout module's
          own flag, which `eqx.nn.inference_mode` sets.

        **Returns:**

        Logits (or the regression value), shape `(num_outputs,)`.
        """
        x, mask = as_arrays(x, mask)
        _check_hidden(x, self.pooler.in_features, ("length",), mask)
        inference = resolve_inference((self.dropout,), key, inference, rate=self.dropout_rate)
        pooled = jnp.tanh(self.pooler(masked_mean(x, mask)))
        pooled = apply_dropout(self.dropout, pooled, key, inference)
        return self.classifier(pooled)


class SpanExtractionHead(eqx.Module):
    """SQuAD-style span head: start and end logits per position (one dense layer)."""

    proj: eqx.nn.Linear

    def __init__(self, dim: IntLike, *, init_std: RealScalar = INIT_STD, key: PRNGKeyArray):
        """**Arguments:**

        - `dim`: hidden size.
        - `init_std`: std of the truncated-normal weights (BERT's 0.02).
        - `key`: a `jax.random.key`.
        """
        check_key("key", key)
        dim = check_int("dim", dim)
        init_std = check_init_std(init_std)
        self.proj = dense(dim, 2, std=init_std, key=key)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        x: Float[Array | np.ndarray, "length dim"],
        mask: Bool[Array | np.ndarray, " length"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Float[Array, " length"], Float[Array, " length"]]:
        """Span logits.

        **Arguments:**

        - `x`: hidden states, shape `(length, dim)`.
        - `mask`: optional, shape `(length,)`, `True` where a span may start or end; other
            positions get the most negative finite logit.
        - `key`: ignored (the head is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        `(start_logits, end_logits)`, each of shape `(length,)`.
        """
        x, mask = as_arrays(x, mask)
        _check_hidden(x, self.proj.in_features, ("length",), mask)
        logits = apply_linear(self.proj, x)
        if mask is not None:
            logits = jnp.where(mask[:, None], logits, jnp.finfo(logits.dtype).min)
        return logits[:, 0], logits[:, 1]


class MultipleChoiceHead(eqx.Module):
    """Multiple-choice head: each choice (encoded separately) is pooled and scored by a
    one-output [`lineax_seq.SequenceClassificationHead`][]. Returns the choices' logits:
    train with a softmax cross-entropy over them (e.g.
    `optax.softmax_cross_entropy_with_integer_labels`)."""

    scorer: SequenceClassificationHead

    def __init__(
        self,
        dim: IntLike,
        *,
        dropout: RealScalar = 0.0,
        init_std: RealScalar = INIT_STD,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `dim`: hidden size.
        - `dropout`: dropout rate before the scoring layer (the paper: 0.1).
        - `init_std`: std of the truncated-normal weights (BERT's 0.02).
        - `key`: a `jax.random.key`.
        """
        check_key("key", key)
        self.scorer = SequenceClassificationHead(
            dim, 1, dropout=dropout, init_std=init_std, key=key
        )

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        x: Float[Array | np.ndarray, "choices length dim"],
        mask: Bool[Array | np.ndarray, "choices length"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> Float[Array, " choices"]:
        """Score every choice.

        **Arguments:**

        - `x`: hidden states of each (context, choice) sequence, `(choices, length, dim)`.
        - `mask`: optional, `True` at real tokens, `(choices, length)`.
        - `key`: dropout key.
        - `inference`: disable dropout; `None` (default) defers to the dropout module's
          own flag, which `eqx.nn.inference_mode` sets.

        **Returns:**

        Logits over choices, shape `(choices,)`.
        """
        x, mask = as_arrays(x, mask)
        _check_hidden(x, self.scorer.pooler.in_features, ("choices", "length"), mask)
        scorer = self.scorer
        inference = resolve_inference((scorer.dropout,), key, inference, rate=scorer.dropout_rate)
        n = x.shape[0]
        keys = None if key is None else jr.split(key, n)
        score = lambda xi, mi, ki: scorer(xi, mi, key=ki, inference=inference)[0]
        return jax.vmap(score)(x, mask, keys)
