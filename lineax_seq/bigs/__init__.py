"""`lineax_seq.bigs`: BiGS (bidirectional gated SSM) encoders, their ablation family
and task heads. Everything takes one example (`jax.vmap` over a batch).

- [`BiGS`][lineax_seq.BiGS]: the encoder (embeddings, layers stored stacked and
  scanned, padding-exact), with the paper's named configurations in `BIGS_CONFIGS`
  (`BiGS.from_config`).
- Layers, the paper's Table 1 family: [`GatedLayer`][lineax_seq.GatedLayer] (GATED/SSM
  is the BiGS layer), [`StackLayer`][lineax_seq.StackLayer] (STACK/ATT is BERT), and
  their routing [`DirectionalSSM`][lineax_seq.DirectionalSSM].
- Heads: [`MaskedLMHead`][lineax_seq.MaskedLMHead],
  [`SequenceClassificationHead`][lineax_seq.SequenceClassificationHead],
  [`SpanExtractionHead`][lineax_seq.SpanExtractionHead],
  [`MultipleChoiceHead`][lineax_seq.MultipleChoiceHead], and
  [`masked_mean`][lineax_seq.masked_mean].
- [`count_parameters`][lineax_seq.count_parameters] of any PyTree, abstract or concrete.
"""

from .._nn import count_parameters
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
