"""`lineax_seq.bigs`: BiGS (bidirectional gated SSM) encoders, their ablation family
and task heads. Everything takes ONE example (`jax.vmap` over a batch).

Encoder
* [`lineax_seq.BiGS`][]`(vocab_size, dim=1024, num_layers=23, *, architecture="gated"|"stack",
  routing="ssm"|"attention", inner_dim=None (3d gated / 4d stack), num_heads=None
  (d//64, or the largest divisor of d below), max_length=None (no absolute positions ->
  any length), num_token_types=0, state_size=64,
  kernel="shared"|"per_channel", ssm_init="legs", dt_min=1e-3, dt_max=1e-1, dropout=0.0,
  final_norm=True, key)`.
  `model(tokens: Int[(L,)], mask: Bool[(L,)] | None = None, token_types=None, *, key=None,
  inference=None) -> Float[(L, dim)]` (padded positions zero; ids out of range raise).
  `BiGS.from_config(name, *, vocab_size=30522, key, **overrides)` with names in
  `lineax_seq.bigs.BIGS_CONFIGS`: "bigs-large", "bigs-12", "bert-large", "bigs-tiny", "bert-tiny"
  (all with the paper's dropout 0.1).
  `model.config()` -> dict of constructor args (JSON-able; `BiGS(**cfg, key=k)` rebuilds).
  `model.kernels(length) -> (num_layers, 2, kc, length)` ([:,0] forward, [:,1] backward;
  kc = 1 shared). `model.layer(i)` -> i-th layer; `model.token_embedding.weight` -> (vocab, d).
  Layers are stored stacked (leading num_layers axis) and scanned.
* [`lineax_seq.count_parameters`][]`(tree) -> int` (array elements).

Layers (`layer(x: (L, d), mask: (L,) | None = None, *, key=None, inference=None)`)
* [`lineax_seq.GatedLayer`][]`(dim, *, inner_dim=3*dim, routing="ssm"|"attention", ...)`:
  GATED/SSM = the BiGS layer; `layer.kernels(length) -> (forward, backward)`.
* [`lineax_seq.StackLayer`][]`(dim, *, inner_dim=4*dim, routing="attention"|"ssm", ...)`:
  STACK/ATT = BERT (pre-LN), STACK/SSM = forward then backward SSM blocks.
* [`lineax_seq.DirectionalSSM`][]`(dim, *, reverse=False, state_size=64, kernel="shared", ...)`:
  `y = K * u + D u`, causal or anti-causal (= Flip . SSM . Flip), padding-aware.

Heads
* [`lineax_seq.MaskedLMHead`][]`(dim, vocab_size, *, tied=True, key)`;
  `head(h: (n, d), embedding: (vocab, d)) -> (n, vocab)` (decoder tied to the embedding,
  plus bias); `tied=False`: the head owns its decoder and is called as `head(h)`.
* [`lineax_seq.SequenceClassificationHead`][]`(dim, num_outputs, *, dropout=0.0, key)`;
  `head(h: (L, d), mask=None, *, key=None, inference=None) -> (num_outputs,)`
  (mean over real tokens, dense, tanh, dropout, dense; num_outputs=1 for regression).
* [`lineax_seq.SpanExtractionHead`][]`(dim, *, key)`; `head(h, mask=None) -> (start, end)`,
  each `(L,)`.
* [`lineax_seq.MultipleChoiceHead`][]`(dim, *, dropout=0.0, key)`;
  `head(h: (choices, L, d), mask: (choices, L) | None, *, key, inference) -> (choices,)`.
* [`lineax_seq.masked_mean`][]`(x: (L, d), mask=None) -> (d,)`.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ._encoder import BIGS_CONFIGS, BiGS
from ._heads import (
    MaskedLMHead,
    MultipleChoiceHead,
    SequenceClassificationHead,
    SpanExtractionHead,
    masked_mean,
)
from ._layers import GatedLayer, StackLayer
from ._ssm import DirectionalSSM


def count_parameters(tree) -> int:
    """Number of parameters (floating-point array elements) in a PyTree.

    Works on concrete models and on abstract ones, e.g.
    `count_parameters(eqx.filter_eval_shape(lambda: BiGS.from_config("bigs-large", key=k)))`
    counts BiGS-Large without allocating it.

    **Arguments:**

    - `tree`: any PyTree (an Equinox module), with JAX or NumPy arrays or `jax.ShapeDtypeStruct`s.

    **Returns:**

    The total number of elements of its floating-point (or complex) leaves.
    """
    leaves = jax.tree.leaves(tree)
    return int(
        sum(
            leaf.size
            for leaf in leaves
            if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct | np.ndarray)
            and jnp.issubdtype(leaf.dtype, jnp.inexact)
        )
    )


__all__ = [
    "BiGS",
    "BIGS_CONFIGS",
    "DirectionalSSM",
    "GatedLayer",
    "MaskedLMHead",
    "MultipleChoiceHead",
    "SequenceClassificationHead",
    "SpanExtractionHead",
    "StackLayer",
    "count_parameters",
    "masked_mean",
]
