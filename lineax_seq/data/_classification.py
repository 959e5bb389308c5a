"""Sequence classification: (text, label) files, and the ListOps generator of LRA."""

from __future__ import annotations

import csv
import json
import os
import pathlib
from collections.abc import Sequence

import grain
import numpy as np
from beartype import beartype

from ._loader import batch_examples
from ._tokenizers import (
    NUM_SPECIAL,
    SPECIAL_TOKENS,
    UNK_ID,
    TokenIds,
    Tokenizer,
    _SpecialIds,
    check_ids,
)

# --------------------------------------------------------------------------------------
# (text, label) files


def _json_line(line: str, path: pathlib.Path, lineno: int) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not a JSON object ({e.msg})") from None


def _check_label(value, num_classes: int | None, where: str) -> int | float:
    if num_classes is None:  # regression
        try:
            target = float(str(value).strip()) if not isinstance(value, int | float) else value
        except ValueError:
            raise ValueError(f"{where}: label {value!r} is not a number") from None
        if isinstance(value, bool) or not np.isfinite(target):
            raise ValueError(f"{where}: label {value!r} is not a finite number")
        return float(target)
    try:
        label = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise ValueError(f"{where}: label {value!r} is not an integer") from None
    if isinstance(value, bool) or not 0 <= label < num_classes:
        raise ValueError(
            f"{where}: label {value!r} is outside the class range [0, {num_classes}) "
            f"(num_classes={num_classes})"
        )
    return label


@beartype
def read_classification(
    path: str | os.PathLike,
    *,
    num_classes: int | None,
    text_field: str = "text",
    label_field: str = "label",
    pair_field: str | None = None,
) -> grain.MapDataset:
    """Read a (text, label) CSV (with a header row) or JSONL file for fine-tuning.

    Classification labels are integers in `[0, num_classes)`; with `num_classes=None`
    the task is regression and labels are finite floats (e.g. STS-B).

    **Arguments:**

    - `path`: a `.csv` or `.jsonl` file.
    - `num_classes`: labels must be integers in `[0, num_classes)`; `None` for
        regression (float labels).
    - `text_field`, `label_field`: column / field names.
    - `pair_field`: optional second text (sentence-pair tasks such as MNLI).

    **Returns:**

    A `grain.MapDataset` of `{"text": str, "label": int | float}` (plus
    `"text_pair": str`).

    **Raises:**

    `FileNotFoundError` for a missing file; `ValueError` (naming file and line) for an
    empty file, a missing field, or a label that is not an integer in range.
    """
    if num_classes is not None and num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got num_classes={num_classes}")
    p = pathlib.Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(path)!r} is not a file")
    if p.suffix not in (".csv", ".jsonl"):
        raise ValueError(f"path {str(path)!r} must end in .csv or .jsonl, got {p.suffix!r}")
    fields = [text_field, label_field] + ([pair_field] if pair_field else [])
    records = []
    with open(p, encoding="utf-8", newline="") as f:
        if p.suffix == ".csv":
            reader = csv.DictReader(f)
            rows = ((i + 2, row) for i, row in enumerate(reader))  # line 1 is the header
        else:
            rows = ((i + 1, _json_line(line, p, i + 1)) for i, line in enumerate(f) if line.strip())
        for lineno, row in rows:
            where = f"{p}:{lineno}"
            for name in fields:
                if not isinstance(row, dict) or name not in row or row[name] is None:
                    raise ValueError(f"{where}: missing field {name!r}")
            record = {
                "text": str(row[text_field]),
                "label": _check_label(row[label_field], num_classes, where),
            }
            if pair_field:
                record["text_pair"] = str(row[pair_field])
            records.append(record)
    if not records:
        raise ValueError(f"path {str(path)!r} contains no examples")
    return grain.MapDataset.source(records)


def _label_array(label) -> np.generic:
    if isinstance(label, float | np.floating):
        return np.float32(label)
    return np.int32(label)


class _EncodeClassification:
    """Picklable map: `{"text", "label"}` -> `{"tokens", "padding_mask", "label"}`."""

    def __init__(self, tokenizer: Tokenizer, length: int, add_special_tokens: bool):
        self.tokenizer, self.length, self.special = tokenizer, length, add_special_tokens

    def __call__(self, record):
        t = self.tokenizer
        ids = t.encode(record["text"])
        if self.special:
            parts = [[t.cls_id], ids, [t.sep_id]]
            if "text_pair" in record:
                parts += [t.encode(record["text_pair"]), [t.sep_id]]
            ids = np.concatenate([np.asarray(q, np.int32) for q in parts])
        ids = ids[: self.length]
        out = np.full(self.length, t.pad_id, dtype=np.int32)
        out[: ids.size] = ids
        return {
            "tokens": out,
            "padding_mask": np.arange(self.length) < ids.size,
            "label": _label_array(record["label"]),
        }


@beartype
def classification_dataset(
    records: grain.MapDataset,
    tokenizer: Tokenizer,
    *,
    length: int,
    batch_size: int,
    add_special_tokens: bool = True,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    drop_remainder: bool = True,
    shard_options: grain.sharding.ShardOptions | None = None,
    num_workers: int = 0,
    num_threads: int = 0,
) -> grain.IterDataset:
    """Batches of tokenized classification examples.

    Each record (from [`lineax_seq.read_classification`][] or
    [`lineax_seq.listops`][]) is encoded as `<cls> text <sep> [text_pair <sep>]`
    (or just `text` if `add_special_tokens=False`), truncated to `length`, padded with
    `<pad>`; then [`lineax_seq.batch_examples`][].

    **Returns:**

    A `grain.IterDataset` of `{"tokens": int32 (B, L), "padding_mask": bool (B, L),
    "label": int32 (B,)}` (`float32` for regression labels).
    """
    if length < 1:
        raise ValueError(f"length must be a positive integer, got length={length}")
    examples = records.map(_EncodeClassification(tokenizer, length, add_special_tokens))
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
    )


# --------------------------------------------------------------------------------------
# ListOps

LISTOPS_OPERATORS: tuple[str, ...] = ("[MIN", "[MAX", "[MED", "[SM")
_LISTOPS_TOKENS = SPECIAL_TOKENS + tuple(str(d) for d in range(10)) + LISTOPS_OPERATORS + ("]",)


class ListOpsTokenizer(_SpecialIds):
    """Whitespace tokenizer for ListOps: 7 special tokens, digits, 4 operators and `]`.

    Ids: specials 0-6 (as every tokenizer here), digits `0`-`9` are 7-16, `[MIN` 17,
    `[MAX` 18, `[MED` 19, `[SM` 20, `]` 21; `vocab_size` is 22.
    """

    _index = {tok: i for i, tok in enumerate(_LISTOPS_TOKENS)}

    @property
    def vocab_size(self) -> int:
        """22."""
        return len(_LISTOPS_TOKENS)

    def encode(self, text: str) -> np.ndarray:
        """Split on whitespace and map each token to its id (`<unk>` if unknown)."""
        return np.asarray([self._index.get(t, UNK_ID) for t in text.split()], dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`[encode(t) for t in texts]`."""
        return [self.encode(t) for t in texts]

    def decode(self, ids: TokenIds) -> str:
        """Space-joined tokens, special tokens dropped (ids outside `[0, 22)` raise)."""
        ids = check_ids(ids, self.vocab_size)
        return " ".join(_LISTOPS_TOKENS[i] for i in ids if i >= NUM_SPECIAL)

    def __repr__(self) -> str:
        return "ListOpsTokenizer(vocab_size=22)"


class _TooLong(Exception):
    pass


def _listops_tree(rng, depth, max_depth, max_args, branch_prob, budget):
    """A random ListOps tree as a token list; returns (tokens, value)."""
    if depth < max_depth and (depth == 0 or rng.random() < branch_prob):
        op = int(rng.integers(len(LISTOPS_OPERATORS)))
        n = int(rng.integers(2, max_args + 1))
        tokens, values = [LISTOPS_OPERATORS[op]], []
        budget[0] -= 2
        for _ in range(n):
            t, v = _listops_tree(rng, depth + 1, max_depth, max_args, branch_prob, budget)
            tokens += t
            values.append(v)
        tokens.append("]")
        if budget[0] < 0:
            raise _TooLong
        if op == 0:
            value = min(values)
        elif op == 1:
            value = max(values)
        elif op == 2:
            value = int(np.median(values))  # LRA convention: floor of the median
        else:
            value = sum(values) % 10
        return tokens, value
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLong
    d = int(rng.integers(10))
    return [str(d)], d


class _ListOpsExample:
    """Picklable map: index -> one ListOps example, deterministic in (seed, index)."""

    def __init__(self, seed, min_length, max_length, max_depth, max_args, branch_prob):
        self.seed = seed
        self.args = (min_length, max_length, max_depth, max_args, branch_prob)

    def __call__(self, index):
        min_length, max_length, max_depth, max_args, branch_prob = self.args
        rng = np.random.default_rng([self.seed, int(index)])
        for _ in range(100_000):
            try:
                tokens, value = _listops_tree(
                    rng, 0, max_depth, max_args, branch_prob, [max_length]
                )
            except _TooLong:
                continue
            if len(tokens) >= min_length:
                return {"text": " ".join(tokens), "label": value}
        raise RuntimeError(  # pragma: no cover
            f"no ListOps sequence with {min_length}-{max_length} tokens in 100000 tries"
        )


@beartype
def listops(
    num_examples: int,
    *,
    seed: int = 0,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    branch_prob: float = 0.25,
) -> grain.MapDataset:
    """The ListOps task of Long Range Arena, generated deterministically per seed.

    Expressions are prefix trees such as `[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]`
    with operators `MIN`, `MAX`, `MED` (median, rounded down) and `SM` (sum modulo 10)
    over digits; the label (10 classes) is the value of the whole expression. As in
    LRA, the root is an operator; below it a node is an operator with probability
    `branch_prob` (while shallower than `max_depth`) and a digit otherwise; operators
    take 2 to `max_args` arguments. Sequences outside `[min_length, max_length]` tokens
    are rejected and redrawn. Example `i` depends only on `(seed, i)`, and is generated
    lazily when read, so any split (`seed`) and any size is cheap.

    Encode with [`lineax_seq.ListOpsTokenizer`][] and
    `classification_dataset(..., add_special_tokens=False)`.

    **Arguments:**

    - `num_examples`: dataset size (LRA: 96k train / 2k valid / 2k test).
    - `seed`: use different seeds for different splits.
    - `min_length`, `max_length`: accepted token-count range.
    - `max_depth`, `max_args`, `branch_prob`: the grammar's shape parameters.

    **Returns:**

    A `grain.MapDataset` of `{"text": str, "label": int}`.
    """
    if num_examples < 1:
        raise ValueError(f"num_examples must be positive, got num_examples={num_examples}")
    if not 1 <= min_length <= max_length:
        raise ValueError(
            f"need 1 <= min_length <= max_length, got min_length={min_length}, "
            f"max_length={max_length}"
        )
    if max_length < 4:
        raise ValueError(f"max_length must be >= 4 (one operator), got max_length={max_length}")
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got max_depth={max_depth}")
    if max_args < 2:
        raise ValueError(f"max_args must be >= 2, got max_args={max_args}")
    if not 0 <= branch_prob < 1:
        raise ValueError(f"branch_prob must be in [0, 1), got branch_prob={branch_prob}")
    make = _ListOpsExample(seed, min_length, max_length, max_depth, max_args, branch_prob)
    return grain.MapDataset.range(num_examples).map(make)
