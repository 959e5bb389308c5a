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

from .._checks import IntLike, RealLike, check_int
from ._loader import batch_examples
from ._tokenizers import (
    NUM_SPECIAL,
    SPECIAL_TOKENS,
    UNK_ID,
    TokenIds,
    Tokenizer,
    _SpecialIds,
    check_ids,
    check_texts,
)

# --------------------------------------------------------------------------------------
# (text, label) files


def _json_line(line: str, path: pathlib.Path, lineno: int) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not a JSON object ({e.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}:{lineno}: not a JSON object (got {type(row).__name__})")
    return row


def _undecodable_line(path: pathlib.Path) -> int:
    """The number of the first line of `path` that is not UTF-8."""
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return lineno
    return 0  # pragma: no cover (only called after a decoding error)


def _read_rows(f, path: pathlib.Path):
    """`(line number, row)` of a CSV (with a header row) or JSONL file open as `f`."""
    if path.suffix == ".csv":
        reader = csv.DictReader(f)
        for row in reader:
            yield reader.line_num, row  # (the last line of a row that spans several)
    else:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield lineno, _json_line(line, path, lineno)


def finite_number(value) -> float | None:
    """A label (`"2"`, `" 2.5 "`, `2.0`...) as a finite float, or `None` if it is not one
    (a class name, a boolean, NaN)."""
    if isinstance(value, bool):
        return None
    try:
        x = float(str(value).strip())
    except ValueError:
        return None
    return x if np.isfinite(x) else None


def _whole_number(value) -> int | None:
    """`value` (a string or float such as `"2"`, `"2.0"` or `2.0`) as an `int`, or `None`."""
    x = finite_number(value)
    return int(x) if x is not None and x.is_integer() else None


def _check_label(
    value, num_classes: int | None, where: str, label_names: tuple[str, ...] | None = None
) -> int | float:
    if label_names is not None:  # named classes
        name = value.strip() if isinstance(value, str) else value
        if isinstance(name, bool) or str(name) not in label_names:
            raise ValueError(f"{where}: label {value!r} is not one of label_names={label_names}")
        return label_names.index(str(name))
    if num_classes is None:  # regression
        try:
            target = float(str(value).strip()) if not isinstance(value, int | float) else value
        except ValueError:
            raise ValueError(f"{where}: label {value!r} is not a number") from None
        if isinstance(value, bool) or not np.isfinite(target):
            raise ValueError(f"{where}: label {value!r} is not a finite number")
        return float(target)
    label = value if isinstance(value, int) else _whole_number(value)
    if label is None:
        raise ValueError(f"{where}: label {value!r} is not an integer")
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
    num_classes: IntLike | None,
    text_field: str = "text",
    label_field: str = "label",
    pair_field: str | None = None,
    label_names: Sequence[str] | None = None,
) -> grain.MapDataset:
    """Read a (text, label) CSV (with a header row) or JSONL file for fine-tuning.

    Classification labels are integers in `[0, num_classes)`, or class names mapped to
    their position in `label_names` (e.g. MNLI's `"entailment"`, ...); with
    `num_classes=None` and no `label_names` the task is regression and labels are
    finite floats (e.g. STS-B).

    **Arguments:**

    - `path`: a `.csv` or `.jsonl` file, UTF-8 (a byte-order mark, as Excel writes,
        is skipped).
    - `num_classes`: labels must be integers in `[0, num_classes)`; `None` for
        regression (float labels), or with `label_names`.
    - `text_field`, `label_field`: column / field names.
    - `pair_field`: optional second text (sentence-pair tasks such as MNLI).
    - `label_names`: the class names, in class order; each label (surrounding
        whitespace ignored) must be one of them and becomes its index. `num_classes`,
        if given as well, must equal their number.

    **Returns:**

    A `grain.MapDataset` of `{"text": str, "label": int | float}` (plus
    `"text_pair": str`).

    **Raises:**

    `FileNotFoundError` for a missing file; `ValueError` (naming file and line) for an
    empty file, bytes that are not UTF-8, a JSONL line that is not a JSON object, a
    missing field, or a label that is not an integer in range (not one of
    `label_names`).
    """
    if num_classes is not None:
        num_classes = check_int("num_classes", num_classes, minimum=2)
    if label_names is not None:
        if isinstance(label_names, str) or not all(
            isinstance(n, str) and n == n.strip() and n for n in label_names
        ):
            raise ValueError(
                "label_names must be a sequence of non-empty strings without surrounding "
                f"whitespace (labels are stripped), got label_names={label_names!r}"
            )
        label_names = tuple(label_names)
        if len(label_names) < 2 or len(set(label_names)) != len(label_names):
            raise ValueError(
                f"label_names must be at least 2 distinct names, got label_names={label_names}"
            )
        if num_classes is not None and num_classes != len(label_names):
            raise ValueError(
                f"num_classes={num_classes} does not match the {len(label_names)} "
                f"label_names={label_names}"
            )
    p = pathlib.Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(path)!r} is not a file")
    if p.suffix not in (".csv", ".jsonl"):
        raise ValueError(f"path {str(path)!r} must end in .csv or .jsonl, got {p.suffix!r}")
    fields = [text_field, label_field] + ([pair_field] if pair_field else [])
    records = []
    try:
        with open(p, encoding="utf-8-sig", newline="") as f:
            for lineno, row in _read_rows(f, p):
                where = f"{p}:{lineno}"
                for name in fields:
                    if name not in row or row[name] is None:
                        raise ValueError(f"{where}: missing field {name!r}")
                record = {
                    "text": str(row[text_field]),
                    "label": _check_label(row[label_field], num_classes, where, label_names),
                }
                if pair_field:
                    record["text_pair"] = str(row[pair_field])
                records.append(record)
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{p}:{_undecodable_line(p)}: not UTF-8 text ({e.reason}); save the file as UTF-8"
        ) from None
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
    length: IntLike,
    batch_size: IntLike,
    add_special_tokens: bool = True,
    seed: IntLike = 0,
    shuffle: bool = True,
    num_epochs: IntLike | None = None,
    drop_remainder: bool = True,
    shard_options: grain.sharding.ShardOptions | None = None,
    num_workers: IntLike = 0,
    num_threads: IntLike = 0,
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
    length = check_int("length", length)
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
        """`[encode(t) for t in texts]` (a single `str` is a `TypeError`)."""
        check_texts(texts)
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


def _listops_max_tokens(max_depth: int, max_args: int, branch_prob: RealLike) -> int:
    """The most tokens a ListOps expression can have: operators (2 tokens, `[OP` and
    `]`) with `max_args` arguments down to depth `max_depth`, whose nodes are digits;
    with `branch_prob = 0` only the root is an operator."""
    depth = max_depth if branch_prob > 0 else 1
    tokens = 1  # a digit
    for _ in range(depth):
        tokens = 2 + max_args * tokens
    return tokens


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
    num_examples: IntLike,
    *,
    seed: IntLike = 0,
    min_length: IntLike = 500,
    max_length: IntLike = 2000,
    max_depth: IntLike = 10,
    max_args: IntLike = 10,
    branch_prob: RealLike = 0.25,
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
    - `seed`: use different seeds for different splits (an integer >= 0).
    - `min_length`, `max_length`: accepted token-count range.
    - `max_depth`, `max_args`, `branch_prob`: the grammar's shape parameters.

    **Returns:**

    A `grain.MapDataset` of `{"text": str, "label": int}`.

    **Raises:**

    `ValueError` for out-of-range arguments, and for a `min_length` longer than any
    expression of depth `max_depth` with `max_args` arguments per operator can be.
    """
    num_examples = check_int("num_examples", num_examples)
    seed = check_int("seed", seed, minimum=0)
    min_length = check_int("min_length", min_length)
    max_length = check_int("max_length", max_length, minimum=4)  # one operator
    max_depth = check_int("max_depth", max_depth)
    max_args = check_int("max_args", max_args, minimum=2)
    if min_length > max_length:
        raise ValueError(
            f"need min_length <= max_length, got min_length={min_length}, max_length={max_length}"
        )
    if not 0 <= branch_prob < 1:
        raise ValueError(f"branch_prob must be in [0, 1), got branch_prob={branch_prob}")
    longest = _listops_max_tokens(max_depth, max_args, branch_prob)
    if min_length > longest:
        raise ValueError(
            f"min_length={min_length} cannot be reached: expressions with max_depth={max_depth}, "
            f"max_args={max_args}{' and branch_prob=0' if branch_prob == 0 else ''} have at "
            f"most {longest} tokens"
        )
    make = _ListOpsExample(seed, min_length, max_length, max_depth, max_args, branch_prob)
    return grain.MapDataset.range(num_examples).map(make)
