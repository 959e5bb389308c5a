"""`lineax_seq.bst`: Block-State Transformer, its layers, and the SLIDE / BRECT baselines.

Every layer maps `(length, dim) -> (length, dim)`, `length` a multiple of `window`, and
decodes a token at a time (`init_cache`, `step`); batch with `jax.vmap`.

- [`BlockStateTransformerLM`][lineax_seq.BlockStateTransformerLM]: the language model;
  `BlockStateTransformerLM.from_variant` builds the paper's variants by name (`"SLIDE"`,
  `"BRECT:FIXED:SKIP"`, `"BST:{SH,MH,MF}:{S4,UNSTRUCT}"`), whose constructor keywords
  [`bst_variant_config`][lineax_seq.bst_variant_config] returns.
- Layers: [`BlockStateTransformerLayer`][lineax_seq.BlockStateTransformerLayer] (SH, MH
  or MF context states), [`SlidingWindowLayer`][lineax_seq.SlidingWindowLayer] (SLIDE)
  and [`BlockRecurrentTransformerLayer`][lineax_seq.BlockRecurrentTransformerLayer]
  (BRECT), and the SSM sublayer [`ContextSSM`][lineax_seq.ContextSSM].
- [`generate`][lineax_seq.generate]: sampling with the recurrent state and attention
  cache, `O(window + state)` per token.
"""

from ._layers import BlockRecurrentTransformerLayer, BlockStateTransformerLayer, SlidingWindowLayer
from ._lm import BlockStateTransformerLM, generate
from ._lm import variant_config as bst_variant_config
from ._ssm import ContextSSM

__all__ = [
    "BlockRecurrentTransformerLayer",
    "BlockStateTransformerLM",
    "BlockStateTransformerLayer",
    "ContextSSM",
    "SlidingWindowLayer",
    "bst_variant_config",
    "generate",
]
