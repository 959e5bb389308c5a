"""`lineax_seq.data`: grain input pipelines for the three model families.

Everything is a `grain.MapDataset` (random access, per example) or, once batched, a
`grain.IterDataset` whose iterator checkpoints its position: `it = iter(ds)`,
`state = it.get_state()` (a small JSON-able dict), later `it.set_state(state)`.
Batches are dicts of NumPy arrays; `batch_size` is per JAX process; data is sharded
over processes with `grain.sharding.ShardByJaxProcess` unless `shard_options` says
otherwise.

Public names (all re-exported flat as `lineax_seq.<name>`):

```python
# corpora (grain.MapDataset of str)
text_corpus(source=None, *, split="train"|"valid"|"test"|"all", valid_fraction=0.05,
            test_fraction=0.05, text_field="text", exclude=()) -> grain.MapDataset

# tokenizers: specials at the same ids everywhere:
#   PAD_ID=0, BOS_ID=1, EOS_ID=2, UNK_ID=3, CLS_ID=4, SEP_ID=5, MASK_ID=6
Tokenizer            # Protocol: vocab_size, special_ids, pad/bos/eos/cls/sep/mask_id,
                     #           encode(str)->int32 array, encode_batch, decode
ByteTokenizer()      # vocab 263: byte b -> b + 7
BPETokenizer.train(texts, *, vocab_size=32_000, min_frequency=2); .save(path);
BPETokenizer.load(path)
ListOpsTokenizer()   # vocab 22

# causal LM: {"inputs": int32 (B, L), "targets": int32 (B, L)}
lm_windows(texts, tokenizer, *, length, stride=None) -> grain.MapDataset (unbatched)
lm_dataset(texts, tokenizer, *, length, batch_size, stride=None, **loader) -> IterDataset

# masked LM: {"tokens": int32 (B, L), "labels": int32 (B, L) (-100 = ignore),
#             "padding_mask": bool (B, L)}
mask_tokens(tokens, rng, *, vocab_size, mask_id, special_ids, mask_prob=0.15,
            mask_token_prob=0.8, random_token_prob=0.1) -> (masked, labels)
mlm_examples(texts, tokenizer, *, length, pack=False) -> grain.MapDataset (unmasked)
mlm_dataset(texts, tokenizer, *, length, batch_size, masking="dynamic"|"fixed", pack=False,
            mask_prob=0.15, mask_token_prob=0.8, random_token_prob=0.1, **loader)
IGNORE_INDEX = -100

# classification: {"tokens": int32 (B, L), "padding_mask": bool (B, L),
#                  "token_types": int32 (B, L) (1 on text_pair <sep>), "label": int32 (B,)}
#   (padding_mask, here and for masked LM: True at real tokens, <cls>/<sep> included,
#   False at padding: the `mask` that BiGS(tokens, mask) takes)
#   (label float32 for regression, i.e. num_classes=None and no label_names)
read_classification(path, *, num_classes: int | None, text_field="text", label_field="label",
                    pair_field=None, label_names=None)
    -> grain.MapDataset of {"text", "label"[, "text_pair"]}
listops(num_examples, *, seed=0, min_length=500, max_length=2000, max_depth=9,
        max_args=10, branch_prob=0.25) -> grain.MapDataset of {"text", "label"}
classification_dataset(records, tokenizer, *, length, batch_size,
                       add_special_tokens=True, truncation="longest_first"|"end",
                       **loader) -> IterDataset

# trajectories: {"states": (B, T+1, d), "actions": (B, T, m) if given}
trajectory_windows(states, actions=None, *, length, stride=1, split="train",
                   valid_fraction=0.1, test_fraction=0.1, split_seed=0) -> MapDataset
trajectory_dataset(states, actions=None, *, length, batch_size, ..., **loader)
split_trajectories(num_trajectories, split, *, valid_fraction, test_fraction,
                   split_seed=0) -> indices

# the loader behind every *_dataset; **loader above are its keyword arguments but
# random_transform (mlm_dataset's dynamic masking is one):
batch_examples(examples, *, batch_size, seed=0, shuffle=True, num_epochs=None,
               drop_remainder=True, shard_options=None, num_workers=0, num_threads=0,
               random_transform=None) -> grain.IterDataset
```
"""

from ._classification import (
    ListOpsTokenizer,
    classification_dataset,
    listops,
    read_classification,
)
from ._corpus import text_corpus
from ._loader import batch_examples
from ._text import (
    IGNORE_INDEX,
    lm_dataset,
    lm_windows,
    mask_tokens,
    mlm_dataset,
    mlm_examples,
)
from ._tokenizers import (
    BOS_ID,
    CLS_ID,
    EOS_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    UNK_ID,
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
)
from ._trajectories import split_trajectories, trajectory_dataset, trajectory_windows

__all__ = [
    "BOS_ID",
    "CLS_ID",
    "EOS_ID",
    "IGNORE_INDEX",
    "MASK_ID",
    "PAD_ID",
    "SEP_ID",
    "UNK_ID",
    "BPETokenizer",
    "ByteTokenizer",
    "ListOpsTokenizer",
    "Tokenizer",
    "batch_examples",
    "classification_dataset",
    "listops",
    "lm_dataset",
    "lm_windows",
    "mask_tokens",
    "mlm_dataset",
    "mlm_examples",
    "read_classification",
    "split_trajectories",
    "text_corpus",
    "trajectory_dataset",
    "trajectory_windows",
]
