"""Causal-LM windows and BERT/RoBERTa masked-LM examples over tokenized documents."""

from __future__ import annotations

from collections.abc import Sequence

import grain
import numpy as np
from beartype import beartype
from jaxtyping import Int

from .._checks import IntLike, RealLike, check_choice, check_int, check_real
from ._loader import batch_examples
from ._tokenizers import Tokenizer, check_ids, check_texts

IGNORE_INDEX = -100
"""Label at positions without a loss (the masked-LM labels of unmasked tokens), as in
PyTorch's and Hugging Face's losses."""


def _as_strings(texts: grain.MapDataset | Sequence[str]) -> list[str]:
    """The documents of `texts`, checked to be strings; the items a `grain.MapDataset`
    has filtered out (`.filter`, which reads them as `None`) are left out."""
    check_texts(texts)
    # Random access: iterating a MapDataset would start grain's threaded reader.
    docs = [texts[i] for i in range(len(texts))]
    filtered = isinstance(texts, grain.MapDataset)
    for i, doc in enumerate(docs):
        if doc is None and filtered:
            continue
        if not isinstance(doc, str):  # str() would train on a repr: "b'...'", "{'text'..."
            hint = (
                " (decode bytes first, e.g. `.map(bytes.decode)`)" if isinstance(doc, bytes) else ""
            )
            raise TypeError(
                f"texts must hold strings (documents' text), got {type(doc).__name__} at "
                f"texts[{i}]{hint}"
            )
    return [str(doc) for doc in docs if doc is not None]


def tokenize_documents(
    texts: grain.MapDataset | Sequence[str],
    tokenizer: Tokenizer,
    *,
    add_bos_eos: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize documents into one flat int32 array plus document offsets.

    Document `i` is `tokens[offsets[i]:offsets[i + 1]]`, wrapped in `<bos> ... <eos>`
    when `add_bos_eos`.
    """
    docs = tokenizer.encode_batch(_as_strings(texts))
    if add_bos_eos:
        bos = np.array([tokenizer.bos_id], np.int32)
        eos = np.array([tokenizer.eos_id], np.int32)
        docs = [np.concatenate([bos, d, eos]) for d in docs]
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.concatenate(docs).astype(np.int32) if docs else np.zeros(0, np.int32)
    return flat, offsets


class _LMWindows:
    """Random-access source: window `i` is `tokens[starts[i] : starts[i] + length + 1]`,
    as fresh arrays (a transform that edits them in place leaves the source intact)."""

    def __init__(self, tokens: np.ndarray, starts: np.ndarray, length: int):
        self.tokens, self.starts, self.length = tokens, starts, length

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index):
        s = int(self.starts[index])
        w = self.tokens[s : s + self.length + 1]
        return {"inputs": w[:-1].copy(), "targets": w[1:].copy()}


def _lm_starts(offsets: np.ndarray, length: int, stride: int) -> np.ndarray:
    lengths = np.diff(offsets)
    if lengths.size == 0:
        raise ValueError("texts has no documents: there is nothing to cut into windows")
    if lengths.max() < length + 1:
        longest = int(lengths.max())
        raise ValueError(
            f"length={length} needs documents of length + 1 = {length + 1} tokens, but the "
            f"longest document has {longest} tokens"
        )
    starts = []
    for a, n in zip(offsets[:-1], lengths, strict=True):
        if n >= length + 1:
            starts.append(a + np.arange(0, n - length, stride, dtype=np.int64))
    return np.concatenate(starts)


@beartype
def lm_windows(
    texts: grain.MapDataset | Sequence[str],
    tokenizer: Tokenizer,
    *,
    length: IntLike,
    stride: IntLike | None = None,
) -> grain.MapDataset:
    """Causal-LM windows of `length + 1` tokens taken within documents.

    Each document is tokenized as `<bos> text <eos>` (`n` tokens); window `k` of a
    document starts at token `k * stride`, for every `k` with `k * stride + length + 1 <= n`,
    and is split into `inputs = w[:-1]` and `targets = w[1:]`. With the default
    `stride = length` the inputs do not overlap (a window's last target is the next
    one's first input) and the targets cover every token after `<bos>` exactly once,
    except the document's last `(n - 1) % length` tokens (those that would only fill
    part of a window, `<eos>` among them), which no window contains. Any `length` works,
    for training and for long-context evaluation (4x-16x the training length), as long
    as some document has `length + 1` tokens; shorter documents are skipped.

    **Arguments:**

    - `texts`: documents, e.g. [`lineax_seq.text_corpus`][] (a sequence of strings: a
        single `str` is a `TypeError`; the items a `grain.MapDataset.filter` dropped
        are left out).
    - `tokenizer`: any [`lineax_seq.Tokenizer`][].
    - `length`: `L`, the model's input length.
    - `stride`: distance between window starts (default `length`).

    **Returns:**

    A `grain.MapDataset` of `{"inputs": int32 (L,), "targets": int32 (L,)}`, fresh
    arrays for every read (editing one in place changes nothing else).

    **Raises:**

    `ValueError` if `length < 1`, `texts` is empty, or `length` is longer than every
    document.
    """
    length = check_int("length", length)
    stride = length if stride is None else check_int("stride", stride)
    tokens, offsets = tokenize_documents(texts, tokenizer, add_bos_eos=True)
    return grain.MapDataset.source(_LMWindows(tokens, _lm_starts(offsets, length, stride), length))


@beartype
def lm_dataset(
    texts: grain.MapDataset | Sequence[str],
    tokenizer: Tokenizer,
    *,
    length: IntLike,
    batch_size: IntLike,
    stride: IntLike | None = None,
    seed: IntLike = 0,
    shuffle: bool = True,
    num_epochs: IntLike | None = None,
    drop_remainder: bool = True,
    shard_options: grain.sharding.ShardOptions | None = None,
    num_workers: IntLike = 0,
    num_threads: IntLike = 0,
) -> grain.IterDataset:
    """Batches of causal-LM windows: [`lineax_seq.lm_windows`][] + [`lineax_seq.batch_examples`][].

    **Arguments:** as for those two functions.

    **Returns:**

    A `grain.IterDataset` of `{"inputs": int32 (B, L), "targets": int32 (B, L)}`;
    `iter()` of it is checkpointable with `get_state()` / `set_state()`.
    """
    windows = lm_windows(texts, tokenizer, length=length, stride=stride)
    return batch_examples(
        windows,
        batch_size=batch_size,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        shard_options=shard_options,
        num_workers=num_workers,
        num_threads=num_threads,
    )


def mask_tokens(
    tokens: Int[np.ndarray, " length"],
    rng: np.random.Generator,
    *,
    vocab_size: IntLike,
    mask_id: IntLike,
    special_ids: Sequence[IntLike],
    mask_prob: RealLike = 0.15,
    mask_token_prob: RealLike = 0.8,
    random_token_prob: RealLike = 0.1,
) -> tuple[Int[np.ndarray, " length"], Int[np.ndarray, " length"]]:
    """BERT/RoBERTa masking of one sequence.

    Exactly `max(1, round(mask_prob * n))` of the `n` non-special positions are chosen
    uniformly without replacement (none if `n = 0`): BERT's pretraining data builder
    takes `round(mask_prob * length)` with `[CLS]` and `[SEP]` counted in `length` (and
    at most `max_predictions_per_seq`), so it may choose one more. Each chosen position
    independently becomes `mask_id` with probability `mask_token_prob` (80%), a
    uniformly random non-special token with probability `random_token_prob` (10%), and
    stays unchanged otherwise (10%).

    **Arguments:**

    - `tokens`: int token ids of one sequence, shape `(length,)`.
    - `rng`: a NumPy generator (the only source of randomness).
    - `vocab_size`, `mask_id`, `special_ids`: from the tokenizer (ids in
        `[0, vocab_size)`).
    - `mask_prob`, `mask_token_prob`, `random_token_prob`: the BERT rates: `mask_prob`
        in `(0, 1]`, the other two in `[0, 1]` with a sum of at most 1.

    **Returns:**

    `(masked_tokens, labels)`, both int32 of shape `(length,)`: `labels` is the original
    token at chosen positions and `IGNORE_INDEX = -100` everywhere else.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got rng={rng!r}"
        )
    _check_rates(mask_prob, mask_token_prob, random_token_prob)
    mask = _Mask(vocab_size, mask_id, special_ids, mask_prob, mask_token_prob, random_token_prob)
    tokens = check_ids(tokens, mask.is_special.size, "tokens").astype(np.int32)
    return mask.mask(tokens, rng)


def _check_rates(
    mask_prob: RealLike, mask_token_prob: RealLike, random_token_prob: RealLike
) -> None:
    for name, rate in (
        ("mask_prob", mask_prob),
        ("mask_token_prob", mask_token_prob),
        ("random_token_prob", random_token_prob),
    ):
        check_real(name, rate, "nonnegative")
    if not 0 < mask_prob <= 1:
        raise ValueError(
            f"mask_prob must be in (0, 1] (every sequence with a non-special token gets at "
            f"least one mask), got mask_prob={mask_prob}"
        )
    for name, p in (("mask_token_prob", mask_token_prob), ("random_token_prob", random_token_prob)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {name}={p}")
    if mask_token_prob + random_token_prob > 1:
        raise ValueError(
            "mask_token_prob + random_token_prob must be <= 1, got "
            f"{mask_token_prob} + {random_token_prob}"
        )


def _mask(tokens, rng, is_special, normal_ids, mask_id, mask_prob, mask_token_prob, random_prob):
    candidates = np.flatnonzero(~is_special[tokens])
    labels = np.full(tokens.shape, IGNORE_INDEX, dtype=np.int32)
    masked = tokens.copy()
    if candidates.size == 0:
        return masked, labels
    k = max(1, int(round(mask_prob * candidates.size)))
    chosen = np.sort(rng.choice(candidates, size=k, replace=False))
    labels[chosen] = tokens[chosen]
    u = rng.random(k)
    masked[chosen[u < mask_token_prob]] = mask_id
    to_random = chosen[(u >= mask_token_prob) & (u < mask_token_prob + random_prob)]
    masked[to_random] = normal_ids[rng.integers(normal_ids.size, size=to_random.size)]
    return masked, labels


class _MLMChunks:
    """Random-access source: `<cls> chunk <sep> <pad>...` of exactly `length` tokens."""

    def __init__(self, tokens, starts, stops, length, cls_id, sep_id, pad_id):
        self.tokens, self.starts, self.stops, self.length = tokens, starts, stops, length
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index):
        body = self.tokens[int(self.starts[index]) : int(self.stops[index])]
        out = np.full(self.length, self.pad_id, dtype=np.int32)
        out[0] = self.cls_id
        out[1 : 1 + body.size] = body
        out[1 + body.size] = self.sep_id
        return {"tokens": out, "padding_mask": np.arange(self.length) < body.size + 2}


class _Mask:
    """Picklable `(example, rng) -> example` applying `mask_tokens`; checks the ids."""

    def __init__(self, vocab_size, mask_id, special_ids, mask_prob, mask_token_prob, random_prob):
        vocab_size = check_int("vocab_size", vocab_size)
        mask_id = check_int("mask_id", mask_id, minimum=0)
        if mask_id >= vocab_size:
            raise ValueError(
                f"mask_id must be in [0, vocab_size={vocab_size}), got mask_id={mask_id}"
            )
        self.is_special = np.zeros(vocab_size, dtype=bool)
        special = list(special_ids)
        if special:  # (an empty list has no integer dtype)
            self.is_special[check_ids(np.asarray(special), vocab_size, "special_ids")] = True
        self.normal_ids = np.flatnonzero(~self.is_special).astype(np.int32)
        self.args = (mask_id, mask_prob, mask_token_prob, random_prob)

    def mask(self, tokens, rng):
        return _mask(tokens, rng, self.is_special, self.normal_ids, *self.args)

    def __call__(self, example, rng):
        tokens, labels = self.mask(example["tokens"], rng)
        return {"tokens": tokens, "labels": labels, "padding_mask": example["padding_mask"]}


class _FixedMask:
    """Picklable `(index, example) -> example`: the mask depends on (seed, index) only."""

    def __init__(self, mask: _Mask, seed: int, num_examples: int):
        self.mask, self.seed, self.num_examples = mask, seed, num_examples

    def __call__(self, index, example):
        # grain passes later epochs' indices unreduced (index + epoch * num_examples).
        index = int(index) % self.num_examples
        return self.mask(example, np.random.default_rng([self.seed, index]))


@beartype
def mlm_examples(
    texts: grain.MapDataset | Sequence[str],
    tokenizer: Tokenizer,
    *,
    length: IntLike,
    pack: bool = False,
) -> grain.MapDataset:
    """Unmasked masked-LM examples: `<cls> chunk <sep>` padded to `length`.

    Each document is tokenized and cut into consecutive chunks of `length - 2` tokens
    (the last one shorter, then padded with `<pad>`). With `pack=True` the documents
    are first joined into one stream, `<sep>` between two documents (RoBERTa's
    FULL-SENTENCES), so that every chunk but the last is full: for corpora of short
    documents (a JSONL file of sentences), which would otherwise be mostly padding. (A
    document's `<sep>` may then open or close a chunk, next to `<cls>` or `<sep>`.)

    **Arguments:**

    - `texts`: documents, e.g. [`lineax_seq.text_corpus`][] (as for
        [`lineax_seq.lm_windows`][]).
    - `tokenizer`: any [`lineax_seq.Tokenizer`][].
    - `length`: sequence length (>= 3).
    - `pack`: chunk the joined stream instead of each document.

    **Returns:**

    A `grain.MapDataset` of `{"tokens": int32 (length,), "padding_mask": bool (length,)}`
    (`padding_mask` is True on real tokens, `<cls>`/`<sep>` included).
    """
    length = check_int("length", length, minimum=3)
    tokens, offsets = tokenize_documents(texts, tokenizer, add_bos_eos=False)
    if tokens.size == 0:
        raise ValueError("texts contain no tokens")
    body = length - 2
    if pack:
        ends = offsets[1:][offsets[1:] > offsets[:-1]]  # of the non-empty documents
        tokens = np.insert(tokens, ends[:-1], tokenizer.sep_id)
        offsets = np.array([0, tokens.size])
    starts, stops = [], []
    for a, b in zip(offsets[:-1], offsets[1:], strict=True):
        s = np.arange(a, b, body, dtype=np.int64)
        starts.append(s)
        stops.append(np.minimum(s + body, b))
    source = _MLMChunks(
        tokens,
        np.concatenate(starts),
        np.concatenate(stops),
        length,
        tokenizer.cls_id,
        tokenizer.sep_id,
        tokenizer.pad_id,
    )
    return grain.MapDataset.source(source)


@beartype
def mlm_dataset(
    texts: grain.MapDataset | Sequence[str],
    tokenizer: Tokenizer,
    *,
    length: IntLike,
    batch_size: IntLike,
    masking: str = "dynamic",
    pack: bool = False,
    mask_prob: RealLike = 0.15,
    mask_token_prob: RealLike = 0.8,
    random_token_prob: RealLike = 0.1,
    seed: IntLike = 0,
    shuffle: bool = True,
    num_epochs: IntLike | None = None,
    drop_remainder: bool = True,
    shard_options: grain.sharding.ShardOptions | None = None,
    num_workers: IntLike = 0,
    num_threads: IntLike = 0,
) -> grain.IterDataset:
    """Batches of BERT/RoBERTa masked-LM examples.

    [`lineax_seq.mlm_examples`][] masked by [`lineax_seq.mask_tokens`][] (15% of
    non-special tokens; 80% `<mask>`, 10% random, 10% unchanged), then
    [`lineax_seq.batch_examples`][]. With `masking="dynamic"` (RoBERTa) every epoch
    draws a new mask; with `"fixed"` (original BERT) an example's mask depends only
    on `seed` and the example, so every epoch sees the same one. Deterministic per seed.

    **Arguments:**

    - `masking`: `"dynamic"` or `"fixed"`.
    - `pack`: join the documents before chunking them (see
        [`lineax_seq.mlm_examples`][]).
    - `mask_prob`, `mask_token_prob`, `random_token_prob`: the BERT rates, as for
        [`lineax_seq.mask_tokens`][].
    - the others as for [`lineax_seq.mlm_examples`][] and [`lineax_seq.batch_examples`][].

    **Returns:**

    A `grain.IterDataset` of `{"tokens": int32 (B, L), "labels": int32 (B, L),
    "padding_mask": bool (B, L)}`; `labels` is `-100` except at the masked positions.
    """
    check_choice("masking", masking, ("dynamic", "fixed"))
    _check_rates(mask_prob, mask_token_prob, random_token_prob)
    seed = check_int("seed", seed, minimum=0)
    examples = mlm_examples(texts, tokenizer, length=length, pack=pack)
    mask = _Mask(
        tokenizer.vocab_size,
        tokenizer.mask_id,
        tokenizer.special_ids,
        mask_prob,
        mask_token_prob,
        random_token_prob,
    )
    if masking == "fixed":
        examples = examples.map_with_index(_FixedMask(mask, seed, len(examples)))
    return batch_examples(
        examples,
        batch_size=batch_size,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        shard_options=shard_options,
        num_workers=num_workers,
        num_threads=num_threads,
        random_transform=mask if masking == "dynamic" else None,
    )
