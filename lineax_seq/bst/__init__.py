"""`lineax_seq.bst`: Block-State Transformer, its layers, and the SLIDE / BRECT baselines.

Public API (every layer maps `(length, dim) -> (length, dim)`, `length` a multiple of
`window`; batch with `jax.vmap`):

* [`lineax_seq.BlockStateTransformerLM`][]`(vocab_size, dim=1024, num_layers=12, *,
  num_heads=8, window=512, mlp_dim=None, bst_layers=None, context="sh"|"mh"|"mf",
  ssm="s4"|"unstruct", state_size=16, dt_min=1e-3, dt_max=1e-1, ssm_features=None,
  num_filters=32, recurrent_layers=(), num_states=None, max_length=None,
  tie_embeddings=True, attention_implementation=None, key)`;
  `lm(tokens: Int[Array, "length"]) -> Float[Array, "length vocab"]`;
  `lm.init_cache(max_length)`, `lm.step(cache, token) -> (cache, logits)`.
  `bst_layers=None` is the paper's (1, 7, 9) of 12 rescaled to `num_layers`;
  `bst_layers=()` is SLIDE; `bst_layers=(), recurrent_layers=(i,)` is BRECT.
* `BlockStateTransformerLM.from_variant(variant, vocab_size, dim=1024, num_layers=12, *,
  key, **overrides)` with `variant` in `"SLIDE"`, `"BRECT:FIXED:SKIP"` (or `"BRECT"`),
  `"BST:{SH,MH,MF}:{S4,UNSTRUCT}"`; [`lineax_seq.bst_variant_config`][]`(variant,
  num_layers)` returns the constructor keywords.
* Single layers (one-layer speed benchmark):
  [`lineax_seq.BlockStateTransformerLayer`][]`(dim, num_heads, window, *, context="sh",
  ssm="s4", state_size=16, dt_min=1e-3, dt_max=1e-1, ssm_features=None, num_filters=32,
  mlp_dim=None, max_length=None, attention_implementation=None, key)`,
  [`lineax_seq.SlidingWindowLayer`][]`(dim, num_heads, window, *, mlp_dim=None,
  attention_implementation=None, key)`,
  [`lineax_seq.BlockRecurrentTransformerLayer`][]`(dim, num_heads, window, *,
  num_states=None, mlp_dim=None, attention_implementation=None, key)`. Each has
  `__call__(x)`, `init_cache(max_length)` and `step(cache, x_t, t) -> (cache, y_t)`.
  `attention_implementation="cudnn"` runs the forward pass's attention on cuDNN's fused
  kernel (NVIDIA GPUs, float16 / bfloat16); the default is XLA.
* [`lineax_seq.ContextSSM`][]`(dim, features, streams, *, ssm="s4", state_size=16,
  dt_min=1e-3, dt_max=1e-1, max_length=None, key)`: the SSM sublayer,
  `(length, dim) -> (length, streams, features)`.
* [`lineax_seq.generate`][]`(lm, prompt, steps, *, key, temperature=1.0, top_k=None)`.
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
