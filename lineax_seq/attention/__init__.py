"""`lineax_seq.attention`: attention building blocks.

* [`lineax_seq.MultiHeadAttention`][]`(dim, num_heads, *, kv_dim=None, use_bias=False,
  output_projection=True, implementation=None, key)`; `mha(x, context=None, *, mask=None,
  bias=None)`, plus `mha.queries(x)`, `mha.keys_values(context)`, `mha.merge_heads(out)`.
* [`lineax_seq.RelativePositionBias`][]`(num_heads, *, num_buckets=32, max_distance=128,
  bidirectional=False, key)`; `rpb(query_length, key_length, *, query_offset=0)` ->
  `(heads, query_length, key_length)`; [`lineax_seq.relative_position_bucket`][].
* [`lineax_seq.sliding_window_attention`][]`(q, k, v, *, window, bias=None,
  implementation=None)`: causal sliding-window attention over blocks of `window` tokens,
  batched over blocks; [`lineax_seq.sliding_window_mask`][]`(window)`.
* [`lineax_seq.SlidingWindowAttention`][]`(dim, num_heads, window, *, num_buckets=32,
  max_distance=128, output_projection=True, implementation=None, key)`: the module.
* `implementation`: `None` / `"xla"` (XLA, everywhere) or `"cudnn"` (cuDNN flash
  attention: NVIDIA GPUs, float16 / bfloat16 inputs).
"""

from ._bias import RelativePositionBias, relative_position_bucket
from ._mha import MultiHeadAttention
from ._window import SlidingWindowAttention, sliding_window_attention, sliding_window_mask

__all__ = [
    "MultiHeadAttention",
    "RelativePositionBias",
    "SlidingWindowAttention",
    "relative_position_bucket",
    "sliding_window_attention",
    "sliding_window_mask",
]
