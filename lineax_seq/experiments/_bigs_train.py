"""Masked-LM pretraining and fine-tuning of BiGS-family encoders: the models with their
heads, the losses, the paper's optimiser, the data (over `lineax_seq.data`) and the
training runs that `bigs pretrain`, `bigs finetune`, the ablation and the demo share."""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

import lineax_seq as ls

from .._checks import check_choice
from ..data._classification import _read_rows, check_table_path, finite_number
from ._cli import matched_width

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
FINAL_DIR = "final"
RESULT_FILE = "result.json"  # a `bigs finetune` run's summary
FINETUNE_FILE = "finetune.json"  # its options, written before it trains (to resume it)


# ---------------------------------------------------------------------------------------
# Models and losses
# ---------------------------------------------------------------------------------------


def scaled_init_std(dim: int) -> float:
    """BERT's 0.02 at the paper's width 1,024, scaled by `1 / sqrt(dim)` elsewhere, so a
    small model's pre-activations have the paper's scale (see `ls.BiGS`'s
    "Initialisation"): 0.08 at `dim = 64`."""
    return 0.02 * math.sqrt(1024 / dim)


def build_encoder(key: PRNGKeyArray, **config: Any) -> ls.BiGS:
    """`ls.BiGS(**config, key=key)`, built as one compiled program (op-by-op
    construction of the stacked layers compiles dozens of small XLA programs)."""
    return eqx.filter_jit(lambda k: ls.BiGS(**config, key=k))(key)


class MaskedLM(eqx.Module):
    """A BiGS-family encoder with the masked-LM head (decoder tied to the embedding)."""

    encoder: ls.BiGS
    head: ls.MaskedLMHead

    def __init__(self, encoder: ls.BiGS, *, key: PRNGKeyArray):
        self.encoder = encoder
        self.head = ls.MaskedLMHead(
            encoder.dim, encoder.vocab_size, init_std=encoder.init_std, key=key
        )

    def __call__(
        self,
        tokens: Int[Array, " length"],
        mask: Bool[Array, " length"],
        positions: Int[Array, " n"],
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> Float[Array, "n vocab"]:
        """Vocabulary logits at `positions` only (the masked ones): the tied decoder is
        the largest matrix product, so it is applied to the predicted tokens alone."""
        h = self.encoder(tokens, mask, key=key, inference=inference)
        return self.head(h[positions], self.encoder.token_embedding.weight)


class Classifier(eqx.Module):
    """A BiGS-family encoder with a sequence classification/regression head."""

    encoder: ls.BiGS
    head: ls.SequenceClassificationHead

    def __init__(self, encoder: ls.BiGS, num_outputs: int, *, key: PRNGKeyArray):
        self.encoder = encoder
        self.head = ls.SequenceClassificationHead(
            encoder.dim,
            num_outputs,
            dropout=encoder.dropout_rate,
            init_std=encoder.init_std,
            key=key,
        )

    def __call__(
        self,
        tokens: Int[Array, " length"],
        mask: Bool[Array, " length"],
        token_types: Int[Array, " length"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> Float[Array, " outputs"]:
        """Logits (or the regression value) of one sequence; `token_types` are the
        segment ids of an encoder with `num_token_types > 0`."""
        k1, k2 = (None, None) if key is None else jr.split(key)
        h = self.encoder(tokens, mask, token_types, key=k1, inference=inference)
        return self.head(h, mask, key=k2, inference=inference)


def max_predictions(length: int, mask_rate: float) -> int:
    """Masked positions scored per sequence: the mean `rate * length` plus six standard
    deviations of the binomial count (more than that is astronomically rare and the
    surplus would simply not be scored)."""
    mean = mask_rate * length
    return min(length, math.ceil(mean + 6 * math.sqrt(mean * (1 - mask_rate)) + 1))


def mlm_loss(
    model: MaskedLM,
    batch: dict[str, Any],
    key: PRNGKeyArray,
    *,
    max_masked: int,
    inference: bool | None = None,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """Mean cross-entropy over the masked tokens of a batch, and their accuracy.

    **Arguments:**

    - `model`: a `MaskedLM`.
    - `batch`: as [`lineax_seq.mlm_dataset`][] makes it: `tokens` (batch, length) ids
        with the masking applied, `padding_mask` (batch, length) `True` at real tokens,
        `labels` (batch, length) the original id at masked positions, negative
        (`lineax_seq.IGNORE_INDEX`) elsewhere.
    - `key`: dropout key.
    - `max_masked`: predictions scored per sequence (see `max_predictions`).
    - `inference`: disable dropout; `None` (default) defers to the dropout modules'
      own flag, which `eqx.nn.inference_mode` sets.

    **Returns:**

    `(loss, {"accuracy": ...})`, averaged over all masked tokens of the batch.
    """
    tokens, mask, targets = batch["tokens"], batch["padding_mask"], batch["labels"]

    def one(tokens, mask, targets, key):
        is_target = targets >= 0
        (positions,) = jnp.nonzero(is_target, size=max_masked, fill_value=0)
        valid = jnp.arange(max_masked) < jnp.sum(is_target)
        logits = model(tokens, mask, positions, key=key, inference=inference)
        labels = jnp.where(valid, targets[positions], 0)
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        hit = valid & (jnp.argmax(logits, axis=-1) == labels)
        return jnp.sum(jnp.where(valid, nll, 0.0)), jnp.sum(hit), jnp.sum(valid)

    keys = jr.split(key, tokens.shape[0])
    nll, hits, count = jax.vmap(one)(tokens, mask, targets, keys)
    count = jnp.maximum(jnp.sum(count), 1).astype(jnp.float32)
    loss = jnp.sum(nll) / count
    return loss, {"accuracy": jnp.sum(hits).astype(jnp.float32) / count}


def classification_loss(
    model: Classifier,
    batch: dict[str, Any],
    key: PRNGKeyArray,
    *,
    inference: bool | None = None,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """Cross-entropy and accuracy (integer `label`) or squared error (float `label`,
    regression with one output) of a batch of `tokens`/`padding_mask`/`label`, as
    [`lineax_seq.classification_dataset`][] makes it; its `token_types` (sentence
    pairs' segment ids) go to an encoder that has token-type embeddings."""
    keys = jr.split(key, batch["tokens"].shape[0])
    types = batch.get("token_types") if model.encoder.num_token_types else None
    call = lambda t, m, s, k: model(t, m, s, key=k, inference=inference)
    out = jax.vmap(call)(batch["tokens"], batch["padding_mask"], types, keys)
    labels = batch["label"]
    if jnp.issubdtype(labels.dtype, jnp.floating):
        err = out[:, 0] - labels
        return jnp.mean(err**2), {"mae": jnp.mean(jnp.abs(err))}
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out, labels))
    accuracy = jnp.mean((jnp.argmax(out, axis=-1) == labels).astype(jnp.float32))
    return loss, {"accuracy": accuracy}


def _classification_eval_loss(
    model: Classifier, batch: dict[str, Any], key: PRNGKeyArray
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    return classification_loss(model, batch, key, inference=True)


@functools.cache
def _mlm_losses(max_masked: int) -> tuple[Any, Any]:
    """`(train, eval)` MLM loss functions; cached (one pair per `max_masked`) so that
    `ls.train`'s compiled steps are reused by runs of the same shapes in one process."""
    train = lambda m, b, k: mlm_loss(m, b, k, max_masked=max_masked)
    return train, lambda m, b, k: mlm_loss(m, b, k, max_masked=max_masked, inference=True)


def ssm_groups(model: PyTree, *, lr: float, ssm_lr: float) -> dict[str, ls.ParamGroup]:
    """The SSM parameter group of `paper_optimizer`: every array of the model's S4D
    kernels (A, B, C, dt) at its own learning rate (`ssm_lr`, capped at `lr` so it never
    outruns the warmup peak; `lr` if `ssm_lr <= 0`) and without weight decay, as S4
    trains them. Empty for a model without SSM kernels (attention routing)."""
    is_kernel = lambda x: isinstance(x, ls.S4DKernel)
    if not any(is_kernel(x) for x in jax.tree.leaves(model, is_leaf=is_kernel)):
        return {}
    rate = ssm_learning_rate(lr=lr, ssm_lr=ssm_lr)
    return {"ssm": ls.ParamGroup(instance_of=ls.S4DKernel, learning_rate=rate, weight_decay=0.0)}


NO_DECAY = r"(\.bias|norm\.weight)$"
"""The paths (`jax.tree_util.keystr`) of the parameters `paper_optimizer` does not decay:
biases and LayerNorm gains."""


def no_decay_groups(model: PyTree) -> dict[str, ls.ParamGroup]:
    """The group of `paper_optimizer` without weight decay: every bias and LayerNorm
    gain (`NO_DECAY`), as BERT and the reference pretraining script (jxiw/BiGS) exclude
    them, so that decay does not pull gains that start at 1 towards 0. Empty for a model
    without such parameters."""
    params = eqx.filter(model, eqx.is_inexact_array)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    if not any(re.search(NO_DECAY, p) for p in paths):
        return {}
    return {"no_decay": ls.ParamGroup(match=NO_DECAY, weight_decay=0.0)}


def ssm_learning_rate(*, lr: float, ssm_lr: float) -> float:
    """The SSM group's peak learning rate: `ssm_lr` capped at `lr`; `lr` if `ssm_lr <= 0`."""
    return min(ssm_lr, lr) if ssm_lr > 0 else lr


def paper_optimizer(
    model: PyTree,
    *,
    lr: float,
    steps: int,
    warmup: float,
    weight_decay: float,
    ssm_lr: float,
    schedule: str = "cosine",
) -> optax.GradientTransformation:
    """The paper's pretraining optimiser (Table 7): AdamW with beta1 0.9, beta2 0.98,
    eps 1e-6, no gradient clipping, linear warmup over a fraction `warmup` of `steps`
    then `schedule` decay to 0; SSM kernel parameters in their own group (see
    `ssm_groups`); biases and LayerNorm gains without weight decay (see
    `no_decay_groups`)."""
    groups = ssm_groups(model, lr=lr, ssm_lr=ssm_lr) | no_decay_groups(model)
    return _optimizer(lr, steps, warmup, weight_decay, schedule, tuple(groups.items()))


@functools.cache
def _optimizer(
    lr: float,
    steps: int,
    warmup: float,
    weight_decay: float,
    schedule: str,
    groups: tuple[tuple[str, ls.ParamGroup], ...],
) -> optax.GradientTransformation:
    # Cached: `ls.train`'s compiled step is keyed on the optimiser object, so runs with
    # the same settings (and model structure) in one process compile once.
    warmup_steps = min(max(int(round(warmup * steps)), 0), max(steps - 1, 0))
    return ls.make_optimizer(
        lr,
        schedule=schedule,
        warmup_steps=warmup_steps,
        total_steps=max(steps, warmup_steps + 1),
        weight_decay=weight_decay,
        b1=0.9,
        b2=0.98,
        eps=1e-6,
        clip_norm=None,
        groups=dict(groups),
    )


def parameter_counts(model: PyTree) -> dict[str, int]:
    """Total parameters and those outside the token/position/type embeddings (also of
    abstract models from `eqx.filter_eval_shape`)."""
    encoder = model.encoder if hasattr(model, "encoder") else model
    embeddings = (
        encoder.token_embedding,
        encoder.position_embedding,
        encoder.token_type_embedding,
    )
    total = ls.count_parameters(model)
    return {"params": total, "params_non_embedding": total - ls.count_parameters(embeddings)}


def matched_inner_dim(config: dict[str, Any], target: int) -> int:
    """The `inner_dim` giving the encoder `config` closest to `target` non-embedding
    parameters (the count is affine in `inner_dim`; measured, not assumed)."""

    def count(inner: int) -> int:
        enc = eqx.filter_eval_shape(
            lambda: ls.BiGS(**{**config, "inner_dim": inner}, key=jr.key(0))
        )
        return parameter_counts(enc)["params_non_embedding"]

    return max(8, matched_width(count, config["dim"], target))


# ---------------------------------------------------------------------------------------
# Data (over lineax_seq.data)
# ---------------------------------------------------------------------------------------


def _subsample(dataset: Any, max_files: int | None) -> list[str]:
    """At most `max_files` documents, evenly spaced over the (id-sorted) corpus, so a
    small run still sees every part of it rather than its alphabetical start."""
    n = len(dataset)
    if max_files is None or max_files >= n:
        return [dataset[i] for i in range(n)]
    return [dataset[int(i)] for i in np.linspace(0, n - 1, max_files)]


def load_corpus(
    corpus: pathlib.Path | None, max_files: int | None, *, exclude: Sequence[pathlib.Path] = ()
) -> tuple[list[str], list[str]]:
    """`(train, held-out)` documents of a corpus (default: the stdlib `.py` sources),
    split by [`lineax_seq.text_corpus`][]'s stable hash, without the paths in `exclude`
    (the run's output folder); `max_files` caps the train documents (and a tenth of it, at
    least 10, the held-out ones). For a user's corpus a note says when the cap leaves
    documents out."""
    dataset = ls.text_corpus(corpus, split="train", exclude=exclude)
    train = _subsample(dataset, max_files)
    if corpus is not None and len(train) < len(dataset):
        print(
            f"note: --max-files {max_files}: training on {len(train):,} of the corpus's "
            f"{len(dataset):,} training documents (evenly spaced)",
            flush=True,
        )
    valid = ls.text_corpus(corpus, split="valid", exclude=exclude)
    return train, _subsample(valid, None if max_files is None else max(10, max_files // 10))


def make_tokenizer(texts: Sequence[str], kind: str, vocab_size: int) -> ls.Tokenizer:
    """A byte-level tokenizer, or BPE trained on `texts` with `vocab_size` tokens."""
    check_choice("tokenizer", kind, ("bpe", "byte"))
    if kind == "byte":
        return ls.ByteTokenizer()
    return ls.BPETokenizer.train(texts, vocab_size=vocab_size)


def save_tokenizer(tok: ls.Tokenizer, run_dir: pathlib.Path) -> str:
    if isinstance(tok, ls.BPETokenizer):
        tok.save(run_dir / TOKENIZER_FILE)
        return "bpe"
    return "byte"


def load_tokenizer(run_dir: pathlib.Path, kind: str) -> ls.Tokenizer:
    return ls.BPETokenizer.load(run_dir / TOKENIZER_FILE) if kind == "bpe" else ls.ByteTokenizer()


def mlm_data(
    texts: Sequence[str],
    tok: ls.Tokenizer,
    *,
    length: int,
    batch_size: int,
    mask_rate: float,
    seed: int,
    train: bool,
    pack: bool = False,
) -> Any:
    """Masked-LM batches: shuffled with dynamic masking, forever (`train`), or one
    ordered pass with fixed masking (held-out data: the same batches for every model;
    a last incomplete batch is left out, as in the committed ablation results); `pack`
    joins the documents first (see [`lineax_seq.mlm_examples`][])."""
    common: dict[str, Any] = dict(
        length=length, batch_size=batch_size, mask_prob=mask_rate, seed=seed, pack=pack
    )
    if train:
        return ls.mlm_dataset(texts, tok, **common)
    return ls.mlm_dataset(
        texts,
        tok,
        **common,
        masking="fixed",
        shuffle=False,
        num_epochs=1,
    )


def mlm_batches(
    train_texts: Sequence[str],
    eval_texts: Sequence[str],
    tok: ls.Tokenizer,
    *,
    length: int,
    batch_size: int,
    mask_rate: float,
    seed: int,
    pack: bool = False,
) -> tuple[Any, Any]:
    """`(train, held-out)` `mlm_data` batches, as `pretrain_mlm` trains and evaluates on."""
    common: dict[str, Any] = dict(
        length=length, batch_size=batch_size, mask_rate=mask_rate, seed=seed, pack=pack
    )
    return (
        mlm_data(train_texts, tok, train=True, **common),
        mlm_data(eval_texts, tok, train=False, **common),
    )


def rows_dataset(rows: Sequence[tuple]) -> Any:
    """`(text, label)` or `(text, text_pair, label)` rows as a grain dataset of records."""
    import grain

    def record(row: tuple) -> dict[str, Any]:
        if len(row) == 3:
            return {"text": row[0], "text_pair": row[1], "label": row[2]}
        return {"text": row[0], "label": row[1]}

    return grain.MapDataset.source([record(r) for r in rows])


def classification_data(
    records: Any,
    tok: ls.Tokenizer,
    *,
    length: int,
    batch_size: int,
    seed: int,
    train: bool,
    truncation: str = "end",
) -> Any:
    """[`lineax_seq.classification_dataset`][] batches: shuffled, forever (`train`), or
    one ordered pass keeping the last partial batch (held-out data). `truncation` of
    sentence pairs as there (`"end"`, the default, is what the committed ablation
    results were made with)."""
    if train:
        return ls.classification_dataset(
            records, tok, length=length, batch_size=batch_size, seed=seed, truncation=truncation
        )
    return ls.classification_dataset(
        records,
        tok,
        length=length,
        batch_size=batch_size,
        truncation=truncation,
        shuffle=False,
        num_epochs=1,
        drop_remainder=False,
    )


def read_rows(
    path: pathlib.Path,
    *,
    regression: bool,
    label_names: Sequence[str] | None = None,
    num_classes: int | None = None,
) -> tuple[Any, int, tuple[str, ...] | None]:
    """A (text, label) CSV/JSONL file (optional `text_pair` column, in every row or in
    none) as records, via [`lineax_seq.read_classification`][]: `(records, outputs,
    label_names)`.

    `outputs` is 1 for regression, else the number of classes: integer labels are
    classes `0 .. max` (at least two distinct ones), or `0 .. num_classes - 1` when
    `num_classes` (the training file's) is given; other labels are class names, numbered
    in sorted order unless `label_names` (the training file's) is given, which is then
    returned. A file whose labels mix numbers and names is refused.
    """
    path = pathlib.Path(path)
    raw, has_pair = _label_column(path)
    pair = "text_pair" if has_pair else None
    if regression:
        return ls.read_classification(path, num_classes=None, pair_field=pair), 1, None
    if num_classes is not None and label_names is None:
        if names := sorted({str(y).strip() for y in raw if finite_number(y) is None}):
            raise ValueError(
                f"{path}: class names {names[:5]} where the training file has class ids "
                f"0 .. {num_classes - 1}; use one kind of label in both files"
            )
        records = ls.read_classification(path, num_classes=num_classes, pair_field=pair)
        return records, num_classes, None
    numbers = [finite_number(y) for y in raw]
    missing = {str(y).strip() for y, x in zip(raw, numbers, strict=True) if x is None}
    if label_names is None and missing and any(x is not None for x in numbers):
        if all(_is_missing_number(y) for y in missing):
            raise ValueError(
                f"{path}: the labels are numbers but for {sorted(missing)}, which are not "
                "class names: give every row a class id 0, 1, ..., or pass --regression for "
                "real values (and drop the rows without one)"
            )
        # Names sorted among numbers would renumber the classes ("10" before "2"): most
        # likely a typo in a file of class ids.
        named = sum(x is None for x in numbers)
        ids = [
            int(x) if x.is_integer() else x for x in sorted({x for x in numbers if x is not None})
        ]
        raise ValueError(
            f"{path}: the labels mix numbers ({_rows(len(numbers) - named, ids)}) and names "
            f"({_rows(named, sorted(missing))}); give every row a class id 0, 1, ..., or "
            "every row a class name"
        )
    found = [x for x in numbers if x is not None]
    if label_names is None and len(found) == len(numbers):
        if not all(x.is_integer() and x >= 0 for x in found):
            raise ValueError(
                f"{path}: the labels are numbers but not class ids 0, 1, ... (e.g. "
                f"{next(x for x in found if not (x.is_integer() and x >= 0))!r}); pass "
                "--regression for real values, or relabel the classes as 0, 1, ... or as "
                "names (e.g. neg, pos)"
            )
        if len(set(found)) < 2:
            raise ValueError(f"{path}: every label is {int(found[0])}; a class task needs two")
        num_classes = int(max(found)) + 1
        records = ls.read_classification(path, num_classes=num_classes, pair_field=pair)
        return records, num_classes, None
    if label_names is None:
        names = sorted({str(y).strip() for y in raw})
        if len(names) < 2:
            raise ValueError(f"{path}: every label is {names[0]!r}; a class task needs two")
        label_names = tuple(names)
    records = ls.read_classification(
        path, num_classes=None, pair_field=pair, label_names=label_names
    )
    return records, len(label_names), tuple(label_names)


def _rows(count: int, values: Sequence[Any]) -> str:
    """`"3 rows: 'a', 'b', ..."`: a count of rows and the first five distinct values."""
    shown = ", ".join(map(repr, values[:5])) + (", ..." if values[5:] else "")
    return f"{count:,} row{'' if count == 1 else 's'}: {shown}"


def _is_missing_number(label: str) -> bool:
    """Whether `label` is how a table writes a missing or non-finite number."""
    if label.lower() in ("na", "n/a", "null", "none"):
        return True
    try:
        return not math.isfinite(float(label))
    except ValueError:
        return False


def _label_column(path: pathlib.Path) -> tuple[list[Any], bool]:
    """Every row's label value, before any conversion, and whether the file has a
    `text_pair` column (a CSV header's, or every JSON object's: a file that mixes
    sentence pairs and single texts is refused, naming the first line that differs)."""
    check_table_path(path)
    labels, has_pair, first = [], False, 0
    with path.open(encoding="utf-8-sig", newline="") as f:
        for lineno, row in _read_rows(f, path):
            if not labels:
                has_pair, first = "text_pair" in row, lineno
            elif ("text_pair" in row) != has_pair:
                raise ValueError(
                    f"{path}:{lineno}: {'no' if has_pair else 'a'} 'text_pair' field, but "
                    f"line {first} has {'one' if has_pair else 'none'}; a task's examples are "
                    "either all sentence pairs or all single texts"
                )
            if "label" not in row:
                fields = ", ".join(map(repr, row))
                where = " (the first line is the header)" if path.suffix == ".csv" else ""
                raise ValueError(
                    f"{path}:{lineno}: missing field 'label'; its fields are {fields}{where}"
                )
            label = row["label"]
            if label is None or not isinstance(label, str | int | float):
                raise ValueError(
                    f"{path}:{lineno}: label {json.dumps(label)} is not a class id, a class "
                    "name or a number"
                )
            if not str(label).strip():
                raise ValueError(f"{path}:{lineno}: empty label")
            if isinstance(label, bool):
                raise ValueError(
                    f"{path}:{lineno}: label {label!r} is a JSON boolean; "
                    "write class ids 0 / 1 or class names"
                )
            labels.append(label)
    if not labels:
        raise ValueError(f"path {str(path)!r} contains no examples")
    return labels, has_pair


def split_records(records: Any, fraction: float = 0.1) -> tuple[Any, Any]:
    """Deterministic split of a record dataset: every `1 / fraction`-th record held out."""
    import grain

    every = max(2, round(1 / fraction))
    items = [records[i] for i in range(len(records))]
    train = [r for i, r in enumerate(items) if i % every != every - 1]
    held = [r for i, r in enumerate(items) if i % every == every - 1]
    return grain.MapDataset.source(train), grain.MapDataset.source(held)


_LISTOPS_OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")


def listops_records(num: int, *, seed: int, tok: ls.Tokenizer, length: int) -> list[dict[str, Any]]:
    """`num` ListOps expressions that fit `length` tokens of `tok` with `<cls>` and
    `<sep>` (`tok` is the pretrained model's tokenizer, not ListOps' own: the fine-tuned
    model keeps its vocabulary). A cut expression's label would be noise, so those
    longer than that are skipped: examples `0, 1, 2, ...` of `ls.listops(seed=seed)`
    that fit, in order. Raises `ValueError` when not even the shortest expression
    (an operator over two digits) fits."""
    budget = length - 2
    shortest = min(len(tok.encode(f"{op} 0 0 ]")) for op in _LISTOPS_OPERATORS)
    if shortest > budget:
        raise ValueError(
            f"the shortest ListOps expression takes {shortest} tokens of this tokenizer; "
            f"with <cls> and <sep> it needs length >= {shortest + 2}, got length={length}"
        )
    # max_depth=10: the trees of the committed results (listops's default was 10 then).
    sample = ls.listops(64, seed=seed, min_length=8, max_length=64, max_depth=10)
    texts = [
        sample[i]["text"]  # pyright: ignore[reportOptionalSubscript] (grain: None if filtered out)
        for i in range(len(sample))
    ]
    per_symbol = sum(len(tok.encode(t)) for t in texts) / sum(len(t.split()) for t in texts)
    max_symbols = max(4, int(budget / per_symbol))
    lo = max(4, max_symbols // 4)
    # Sized by the mean tokens per symbol, most expressions fit; `tries` bounds the rest.
    tries = 10 * num + 1000
    data = ls.listops(tries, seed=seed, min_length=lo, max_length=max_symbols, max_depth=10)
    records = []
    for i in range(tries):
        record: dict[str, Any] = data[i]  # pyright: ignore[reportAssignmentType] (as above)
        if len(tok.encode(record["text"])) <= budget:
            records.append(record)
            if len(records) == num:
                return records
    raise ValueError(
        f"only {len(records)} of {tries} ListOps expressions fit length={length} tokens "
        f"of this tokenizer; need {num} (a longer length fits more)"
    )


# ---------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------


def load_pretrained(run_dir: pathlib.Path) -> tuple[MaskedLM, ls.Tokenizer, dict[str, Any]]:
    """Load a finished `bigs pretrain` run: the MLM model, its tokenizer and config."""
    run_dir = pathlib.Path(run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        raise ValueError(f"{run_dir} is not a `bigs pretrain` output (no {CONFIG_FILE})")
    config = json.loads((run_dir / CONFIG_FILE).read_text())
    if not isinstance(config, dict) or not {"model", "tokenizer"} <= config.keys():
        raise ValueError(
            f"{run_dir} is not a `bigs pretrain` output: its {CONFIG_FILE} has no model "
            "and tokenizer entries"
        )
    template = eqx.filter_eval_shape(
        lambda: MaskedLM(ls.BiGS(**config["model"], key=jr.key(0)), key=jr.key(1))
    )
    model = ls.load_checkpoint(run_dir / FINAL_DIR, model=template).model
    return model, load_tokenizer(run_dir, config["tokenizer"]), config


def load_finetuned(run_dir: pathlib.Path) -> tuple[Classifier, ls.Tokenizer, dict[str, Any]]:
    """Load a `bigs finetune` run: the fine-tuned classifier (from `run_dir/final`), the
    tokenizer of the pretraining run it started from (which must still exist) and the
    run's `result.json` (label names: class `i` is `label_names[i]`)."""
    run_dir = pathlib.Path(run_dir)
    if not (run_dir / RESULT_FILE).exists():
        raise ValueError(f"{run_dir} is not a `bigs finetune` output (no {RESULT_FILE})")
    summary = json.loads((run_dir / RESULT_FILE).read_text())
    mlm, tok, _ = load_pretrained(pathlib.Path(summary["checkpoint"]))
    template = eqx.filter_eval_shape(
        lambda: Classifier(mlm.encoder, summary["num_outputs"], key=jr.key(0))
    )
    model = ls.load_checkpoint(run_dir / FINAL_DIR, model=template).model
    return model, tok, summary


def print_metrics(prefix: str, metrics: dict[str, float]) -> None:
    shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
    print(f"{prefix}: {shown}", flush=True)


def last_metrics(history: list[dict], split: str) -> dict[str, float]:
    records = [r for r in history if r.get("split") == split]
    if not records:
        return {}
    return {k: v for k, v in records[-1].items() if k not in ("step", "split")}


def pretrain_mlm(
    model: MaskedLM,
    train_texts: Sequence[str],
    eval_texts: Sequence[str],
    tok: ls.Tokenizer,
    *,
    steps: int,
    batch_size: int,
    length: int,
    lr: float,
    ssm_lr: float = 1e-3,
    weight_decay: float = 0.01,
    warmup: float = 0.01,
    schedule: str = "cosine",
    mask_rate: float = 0.15,
    pack: bool = False,
    eval_batches: int = 8,
    eval_every: int = 0,
    seed: int = 0,
    out_dir: pathlib.Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    progress: bool = True,
    data: tuple[Any, Any] | None = None,
) -> ls.TrainResult:
    """Masked-LM pretraining of `model` with the paper's optimiser (see `paper_optimizer`)
    on [`lineax_seq.mlm_dataset`][] batches (dynamic masking, no next-sentence task;
    `pack` joins the documents before cutting sequences).

    Evaluates on the first `eval_batches` batches of `eval_texts` (fixed masks, no
    shuffling: the same batches for every model) at the end and every `eval_every`.
    `data`: the `mlm_batches` of the texts with these settings, when already built (a
    command builds them before it writes anything, to report a corpus too small).
    """
    loss, eval_loss = _mlm_losses(max_predictions(length, mask_rate))
    if data is None:
        data = mlm_batches(
            train_texts,
            eval_texts,
            tok,
            length=length,
            batch_size=batch_size,
            mask_rate=mask_rate,
            seed=seed,
            pack=pack,
        )
    return _train(
        model,
        loss,
        eval_loss,
        *data,
        steps=steps,
        optimizer=dict(
            lr=lr, warmup=warmup, weight_decay=weight_decay, ssm_lr=ssm_lr, schedule=schedule
        ),
        seed=seed,
        out_dir=out_dir,
        progress=progress,
        eval_every=eval_every,
        eval_batches=eval_batches,
        checkpoint_every=checkpoint_every,
        resume=resume,
        unit="tokens",
    )


def finetune_classifier(
    model: Classifier,
    train_records: Any,
    eval_records: Any,
    tok: ls.Tokenizer,
    *,
    length: int,
    steps: int,
    batch_size: int,
    lr: float,
    ssm_lr: float = 1e-3,
    weight_decay: float = 0.01,
    warmup: float = 0.1,
    schedule: str = "linear",
    eval_every: int = 0,
    seed: int = 0,
    out_dir: pathlib.Path | None = None,
    checkpoint_every: int = 0,
    progress: bool = True,
    truncation: str = "end",
) -> ls.TrainResult:
    """Fine-tune a classifier or regressor (Table 8's recipe by default: AdamW, 10% warmup,
    linear decay) on records `{"text"[, "text_pair"], "label"}` and evaluate on all of
    `eval_records` at the end (and every `eval_every` steps). `truncation`: of sentence
    pairs longer than `length`, as in [`lineax_seq.classification_dataset`][]. With
    `checkpoint_every`, a run in `out_dir` continues from its newest checkpoint."""
    if len(train_records) < batch_size:
        raise ValueError(
            f"the training set has {len(train_records)} examples, fewer than "
            f"batch_size={batch_size}"
        )
    common: dict[str, Any] = dict(
        length=length, batch_size=batch_size, seed=seed, truncation=truncation
    )
    return _train(
        model,
        classification_loss,
        _classification_eval_loss,
        classification_data(train_records, tok, train=True, **common),
        classification_data(eval_records, tok, train=False, **common),
        steps=steps,
        optimizer=dict(
            lr=lr, warmup=warmup, weight_decay=weight_decay, ssm_lr=ssm_lr, schedule=schedule
        ),
        seed=seed,
        out_dir=out_dir,
        progress=progress,
        eval_every=eval_every,
        checkpoint_every=checkpoint_every,
    )


def _train(
    model: eqx.Module,
    loss: Any,
    eval_loss: Any,
    data: Any,
    eval_data: Any,
    *,
    steps: int,
    optimizer: dict[str, Any],
    seed: int,
    out_dir: pathlib.Path | None,
    progress: bool,
    **options: Any,
) -> ls.TrainResult:
    """`ls.train` with `paper_optimizer(model, steps=steps, **optimizer)`, ~20 log points
    and curves saved when there is an `out_dir`; `options` go to `ls.train`."""
    return ls.train(
        model,
        paper_optimizer(model, steps=steps, **optimizer),
        loss,
        data,
        steps=steps,
        key=jr.key(seed),
        eval_data=eval_data,
        eval_fn=eval_loss,
        log_every=max(1, min(25, steps // 20)),
        out_dir=out_dir,
        progress=progress,
        plot=out_dir is not None,
        **options,
    )


def save_json(payload: dict[str, Any], path: pathlib.Path) -> pathlib.Path:
    """Write `payload` to `path` atomically (a crash leaves the old file or the new one)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)
    return path
