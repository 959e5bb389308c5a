"""Sequence classification: (text, label) files, and the ListOps generator of LRA."""

from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import re
from collections.abc import Mapping, Sequence

import grain
import numpy as np
from beartype import beartype

from .._checks import IntLike, RealLike, check_choice, check_int, check_path
from ._corpus import LONE_SURROGATE
from ._loader import batch_examples
from ._tokenizers import (
    NUM_SPECIAL,
    SPECIAL_TOKENS,
    UNK_ID,
    TokenIds,
    Tokenizer,
    _SpecialIds,
    check_ids,
    check_text,
    check_texts_list,
)

# --------------------------------------------------------------------------------------
# (text, label) files


def _json_line(line: str, path: pathlib.Path, lineno: int) -> dict:
    try:
        row = json.loads(line)
    except ValueError as e:  # JSONDecodeError, or an integer of over 4,300 digits
        raise ValueError(f"{path}:{lineno}: not a JSON object ({getattr(e, 'msg', e)})") from None
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


def _csv_rows(f, path: pathlib.Path):
    """`(line number, row)` of a CSV file with a header row: every row must have as many
    fields as the header (`csv.DictReader` would file extra fields under the key `None`
    and fill missing ones with `None`), and the header must not repeat a column."""
    reader = csv.reader(f)
    try:
        header = next(reader, None)
        if header is None:
            return
        for name in header:
            if header.count(name) > 1:
                raise ValueError(
                    f"{path}:{reader.line_num}: the header names column {name!r} "
                    f"{header.count(name)} times; column names must be distinct"
                )
        for fields in reader:
            if not "".join(fields).strip():  # a blank line (spaces, or empty fields only)
                continue
            if len(fields) != len(header):
                raise ValueError(
                    f"{path}:{reader.line_num}: {len(fields)} field(s), but the header has "
                    f"{len(header)} ({','.join(header)}); quote a text that contains commas "
                    '(e.g. "a, b")'
                )
            yield reader.line_num, dict(zip(header, fields, strict=True))  # (its last line)
    except csv.Error as e:
        if "field limit" in str(e):
            raise ValueError(
                f"{path}:{reader.line_num}: a field is longer than the csv module's limit of "
                f"{csv.field_size_limit()} characters; shorten it or write the file as JSONL"
            ) from None
        raise ValueError(f"{path}:{reader.line_num}: not valid CSV ({e})") from None


def _read_rows(f, path: pathlib.Path):
    """`(line number, row)` of a CSV (with a header row) or JSONL file open as `f`."""
    if path.suffix.lower() == ".csv":
        yield from _csv_rows(f, path)
    else:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield lineno, _json_line(line, path, lineno)


def check_table_path(path: str | os.PathLike) -> pathlib.Path:
    """`path` as a `Path`, if it is a `.csv` or `.jsonl` file; else the error that says so."""
    p = check_path("path", path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(path)!r} is not a file")
    if p.suffix.lower() not in (".csv", ".jsonl"):
        raise ValueError(f"path {str(path)!r} must end in .csv or .jsonl, got {p.suffix!r}")
    return p


_DECIMAL = re.compile(r"[+-]?((\d+\.?\d*|\.\d+)(e[+-]?\d+)?|inf|infinity|nan)", re.A | re.I)


def _parse_number(text: str) -> float:
    """`text` as a float if it is a plain decimal number (`"2"`, `" -2.5e3 "`, `"nan"`),
    else a `ValueError`: Python's `float` also reads `"1_0"` as 10 and other scripts'
    digits."""
    text = text.strip()
    if not _DECIMAL.fullmatch(text):
        raise ValueError(text)
    return float(text)


def finite_number(value) -> float | None:
    """A label (`"2"`, `" 2.5 "`, `2.0`...) as a finite float, or `None` if it is not one
    (a class name, a boolean, NaN)."""
    if isinstance(value, bool):
        return None
    try:
        x = float(value) if isinstance(value, int | float) else _parse_number(str(value))
    except (ValueError, OverflowError):
        return None
    return x if np.isfinite(x) else None


def _whole_number(value) -> int | None:
    """`value` (a string or float such as `"2"`, `"2.0"` or `2.0`) as an `int`, or `None`."""
    x = finite_number(value)
    return int(x) if x is not None and x.is_integer() else None


_FLOAT32_MAX = float(np.finfo(np.float32).max)  # regression labels are batched as float32


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
            target = float(value) if isinstance(value, int | float) else _parse_number(str(value))
        except ValueError:
            raise ValueError(f"{where}: label {value!r} is not a number") from None
        except OverflowError:  # a JSON integer beyond the float range
            target = math.inf
        if isinstance(value, bool) or not math.isfinite(target):
            raise ValueError(f"{where}: label {value!r} is not a finite number")
        if abs(target) > _FLOAT32_MAX:
            raise ValueError(
                f"{where}: label {value!r} is beyond the float32 range of the batches' labels "
                f"(|label| <= {_FLOAT32_MAX:.4g})"
            )
        return target
    if isinstance(value, bool):
        raise ValueError(f"{where}: label {value!r} is a boolean, not an integer class index")
    label = value if isinstance(value, int) else _whole_number(value)
    if label is None:
        raise ValueError(f"{where}: label {value!r} is not an integer")
    if not 0 <= label < num_classes:
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
    - `pair_field`: the field of the second text of sentence-pair tasks (such as
        MNLI), or `None` for single texts.
    - `label_names`: the class names, in class order; each label (surrounding
        whitespace ignored) must be one of them and becomes its index. `num_classes`,
        if given as well, must equal their number.

    **Returns:**

    A `grain.MapDataset` of `{"text": str, "label": int | float}` (plus
    `"text_pair": str`).

    **Raises:**

    `FileNotFoundError` for a missing file; `ValueError` for `pair_field=""`, and
    (naming file and line) for an empty file, bytes that are not UTF-8, a CSV row with
    more or fewer fields than the header (an unquoted comma in a text), a CSV header
    that repeats a column, a CSV field over the `csv` module's size limit
    (`csv.field_size_limit()`, 131,072 characters by default; JSONL has none), a JSONL
    line that is not a JSON object, a missing field, a text that is not a string (a
    JSON list, number or `null`) or holds half a surrogate pair (`"\\ud83d"`), or a
    label that is not an integer in range (not one of `label_names`; for regression,
    not a finite number within float32's range).
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
    p = check_table_path(path)
    if pair_field == "":
        raise ValueError(
            "pair_field must be a field name (the second text of a sentence pair) or None, "
            "got pair_field=''"
        )
    texts = [text_field] + ([pair_field] if pair_field is not None else [])
    records = []
    try:
        with open(p, encoding="utf-8-sig", newline="") as f:
            for lineno, row in _read_rows(f, p):
                where = f"{p}:{lineno}"
                for name in [*texts, label_field]:
                    if name not in row:
                        raise ValueError(  # e.g. a CSV header "text, label" has " label"
                            f"{where}: missing field {name!r}; its fields are "
                            f"{', '.join(map(repr, row))}"
                        )
                for name in texts:  # str() would read a list or a number as its repr
                    if not isinstance(row[name], str):
                        raise ValueError(
                            f"{where}: field {name!r} must be a string, got {row[name]!r}"
                        )
                    if half := LONE_SURROGATE.search(row[name]):  # no tokenizer takes it
                        raise ValueError(
                            f"{where}: field {name!r} holds {half.group()!r}, half of a "
                            "surrogate pair (e.g. an emoji cut in two), which is not text"
                        )
                record = {
                    "text": row[text_field],
                    "label": _check_label(row[label_field], num_classes, where, label_names),
                }
                if pair_field is not None:
                    record["text_pair"] = row[pair_field]
                records.append(record)
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{p}:{_undecodable_line(p)}: not UTF-8 text ({e.reason}); save the file as UTF-8"
        ) from None
    if not records:
        raise ValueError(f"path {str(path)!r} contains no examples")
    return grain.MapDataset.source(records)


TRUNCATIONS = ("end", "longest_first")


def _check_record(record, index: int) -> bool:
    """Whether `records[index]` has a float label (regression); a `ValueError` naming
    `records` and `index` if it is not `{"text": str, "label": int | float[,
    "text_pair": str]}`."""
    where = f"records[{index}]"
    expected = (
        '{"text": str, "label": int | float} (plus "text_pair": str for sentence pairs), '
        "as read_classification and listops make them"
    )
    if not isinstance(record, Mapping):
        raise ValueError(f"{where} must be a dict {expected}, got {type(record).__name__}")
    for name in ("text", "label"):
        if name not in record:
            raise ValueError(
                f"{where} has no {name!r} (keys {sorted(map(str, record))}); each record "
                f"must be {expected}"
            )
    for name in ("text", "text_pair"):
        if name in record and not isinstance(record[name], str):
            raise ValueError(f"{where}[{name!r}] must be a string, got {record[name]!r}")
    label = record["label"]
    kind = np.asarray(label).dtype.kind if np.ndim(label) == 0 else None  # 0-d arrays too
    if isinstance(label, str) or kind not in ("i", "u", "f"):
        raise ValueError(
            f"{where}['label'] must be an int (a class id) or a float (a regression "
            f"target), got {label!r}"
        )
    return kind == "f"


def _label_array(label, regression: bool, index: int) -> np.generic:
    """`label` as an `int32` class id, or a `float32` target if `regression` (the first
    record's label is a float), so that a batch has one dtype."""
    where = f"records[{index}]['label']"
    if regression:
        if not (math.isfinite(float(label)) and abs(float(label)) <= _FLOAT32_MAX):
            raise ValueError(f"{where} {label!r} is not a finite float32 regression target")
        return np.float32(label)
    if np.asarray(label).dtype.kind == "f" and not float(label).is_integer():
        raise ValueError(
            f"{where} {label!r} is not a whole number, but the first "
            "record's label is an int, which makes the labels class ids; write every "
            "regression target as a float (1.0, not 1)"
        )
    if not 0 <= int(label) <= np.iinfo(np.int32).max:
        raise ValueError(f"{where} {label!r} is not a class id (an integer in [0, 2**31))")
    return np.int32(label)


def _longest_first(a: np.ndarray, b: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """`a` and `b` cut to at most `budget` tokens in all, by removing the last token of
    the longer one (of `b` on a tie) one at a time; in closed form."""
    if a.size + b.size <= budget:
        return a, b
    keep_a = min(a.size, max(budget - b.size, (budget + 1) // 2))
    return a[:keep_a], b[: budget - keep_a]


# The shortest `length` that keeps a token of each text next to the special tokens:
# `<cls> a <sep>` and `<cls> a <sep> b <sep>`.
MIN_LENGTH, MIN_PAIR_LENGTH = 3, 5


class _EncodeClassification:
    """Picklable map with index: `{"text", "label"}` -> `{"tokens", "padding_mask",
    "token_types", "label"}`, or a `ValueError` naming `records[index]` if the record
    is malformed.

    grain passes a later epoch's index unreduced (`index + epoch * num_records`); the
    errors name the record it reads, `index % num_records`.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        length: int,
        add_special_tokens: bool,
        truncation: str = "end",
        regression: bool = False,
        num_records: int | None = None,
    ):
        self.tokenizer, self.length, self.special = tokenizer, length, add_special_tokens
        self.truncation, self.regression = truncation, regression
        self.num_records = num_records

    def __call__(self, index: int, record):
        if self.num_records:
            index %= self.num_records
        _check_record(record, index)
        if "text_pair" in record and not self.special:
            raise ValueError(
                f"records[{index}] has a 'text_pair', which add_special_tokens=False would "
                "drop: sentence pairs are encoded as <cls> text <sep> text_pair <sep>"
            )
        is_pair = "text_pair" in record
        if self.special and self.length < (MIN_PAIR_LENGTH if is_pair else MIN_LENGTH):
            raise ValueError(
                f"length={self.length} leaves no room for "
                f"{'a sentence pair' if is_pair else 'a text'} in records[{index}]: <cls>, <sep> "
                "and at least one token of each text need length >= "
                f"{MIN_PAIR_LENGTH if is_pair else MIN_LENGTH} (or add_special_tokens=False)"
            )
        t = self.tokenizer
        ids = t.encode(record["text"])
        second = self.length  # where the second segment (type 1) starts
        if self.special:
            pair = t.encode(record["text_pair"]) if "text_pair" in record else None
            if self.truncation == "longest_first" and pair is None:
                ids = ids[: max(self.length - 2, 0)]
            elif self.truncation == "longest_first" and pair is not None:
                ids, pair = _longest_first(ids, pair, max(self.length - 3, 0))
            parts = [[t.cls_id], ids, [t.sep_id]]
            if pair is not None:
                second = len(ids) + 2
                parts += [pair, [t.sep_id]]
            ids = np.concatenate([np.asarray(q, np.int32) for q in parts])
        ids = ids[: self.length]
        out = np.full(self.length, t.pad_id, dtype=np.int32)
        out[: ids.size] = ids
        positions = np.arange(self.length)
        return {
            "tokens": out,
            "padding_mask": positions < ids.size,
            "token_types": ((positions >= second) & (positions < ids.size)).astype(np.int32),
            "label": _label_array(record["label"], self.regression, index),
        }


@beartype
def classification_dataset(
    records: grain.MapDataset,
    tokenizer: Tokenizer,
    *,
    length: IntLike,
    batch_size: IntLike,
    add_special_tokens: bool = True,
    truncation: str = "longest_first",
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

    **Arguments:**

    - `records`: a `grain.MapDataset` of `{"text": str, "label": int | float}` (plus
        `"text_pair": str` for sentence pairs). The first record is checked here; its
        label decides the labels' dtype: an `int` makes every label an `int32` class id
        (a whole-number float such as `2.0` is accepted), a `float` makes every label a
        `float32` regression target (ints are converted).
    - `tokenizer`: any [`lineax_seq.Tokenizer`][].
    - `length`: tokens per example.
    - `batch_size`, `seed`, `shuffle`, `num_epochs`, `drop_remainder`,
        `shard_options`, `num_workers`, `num_threads`: as in
        [`lineax_seq.batch_examples`][].
    - `add_special_tokens`: add `<cls>` and `<sep>` (`False` for ListOps, whose
        expressions are encoded as they are).
    - `truncation`: how an example longer than `length` is cut. `"longest_first"` (the
        default, BERT's and Hugging Face's): the special tokens are kept and the texts
        shortened, the longer of `text` and `text_pair` by one token at a time
        (`text_pair` on a tie), so both keep about half of `length` when both are long.
        `"end"` (what the committed BiGS ablation results were made with): the encoded
        `<cls> text <sep> text_pair <sep>` is cut at the end, so a long `text` drops
        the final `<sep>`, and `text_pair` with its separators. Without special tokens
        both cut `text` at the end (and a sentence pair is refused: nothing would
        separate its texts).

    **Returns:**

    A `grain.IterDataset` of `{"tokens": int32 (B, L), "padding_mask": bool (B, L),
    "token_types": int32 (B, L), "label": int32 (B,)}` (`float32` for regression
    labels). `token_types` are BERT's segment ids: 1 on `text_pair <sep>`, 0 elsewhere
    (`<cls> text <sep>`, padding, and every position of a single text).

    **Raises:**

    `ValueError` for a bad `length` or `truncation`, for an empty `records`, and
    (naming `records` and the index) for a record of another form, a sentence pair with
    `add_special_tokens=False`, a fractional label among class ids, or a `length` with
    no room for text beside the special tokens (under 3, or 5 for a sentence pair):
    for the first record at once, for the others while iterating.
    """
    length = check_int("length", length)
    check_choice("truncation", truncation, TRUNCATIONS)
    if len(records) == 0:
        raise ValueError("records is empty: there are no examples to batch")
    first = records[0]  # random access: cheap, and no whole pass over the dataset
    regression = _check_record(first, 0)
    encode = _EncodeClassification(
        tokenizer, length, add_special_tokens, truncation, regression, len(records)
    )
    encode(0, first)  # the first record's errors now; the others' while iterating
    examples = records.map_with_index(encode)
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
    `[MAX` 18, `[MED` 19, `[SM` 20, `]` 21; `vocab_size` is 22. The text of
    [`lineax_seq.listops`][]; LRA's released ListOps files also hold `(` and `)`, which
    its own pipeline deletes: delete them first (here they would be `<unk>`).
    """

    _index = {tok: i for i, tok in enumerate(_LISTOPS_TOKENS)}

    @property
    def vocab_size(self) -> int:
        """22."""
        return len(_LISTOPS_TOKENS)

    def encode(self, text: str) -> np.ndarray:
        """Split on whitespace and map each token to its id (`<unk>` if unknown): int32,
        shape `(n,)`."""
        tokens = check_text(text).split()
        return np.asarray([self._index.get(t, UNK_ID) for t in tokens], dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`[encode(t) for t in texts]`, int32 arrays of shape `(n_i,)` (a single `str` is a
        `TypeError`)."""
        return [self.encode(t) for t in check_texts_list(texts)]

    def decode(self, ids: TokenIds) -> str:
        """Space-joined tokens of ids `(n,)`, special tokens dropped (ids outside `[0, 22)`
        raise)."""
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


def _listops_lengths(
    max_depth: int, max_args: int, branch_prob: RealLike, max_length: int
) -> np.ndarray:
    """Which token counts `0..max_length` a ListOps expression can have (as generated by
    `_listops_tree`), a boolean mask of shape `(max_length + 1,)`: not all can, e.g. with
    `max_args=2` only 4, 7, 10, ... at depth 2."""
    size = max_length + 1
    digit = np.arange(size) == 1
    node = digit  # a node at depth `max_depth` is a digit
    for depth in reversed(range(max_depth)):
        # Lengths of 2, 3, ... children: sums of one length each, by FFT convolutions of
        # the masks (counts, read back as masks).
        node_f = np.fft.rfft(node, 2 * size)
        children, operator = node, np.zeros_like(node)
        for _ in range(2, max_args + 1):
            children = np.fft.irfft(np.fft.rfft(children, 2 * size) * node_f, 2 * size)[:size]
            children = children > 0.5
            operator |= children
        operator = np.concatenate([[False, False], operator[:-2]])  # `[OP` and `]`
        if depth == 0:  # the root is always an operator
            return operator
        node = digit | operator if branch_prob > 0 else digit
    raise ValueError(f"max_depth must be >= 1, got max_depth={max_depth}")


class _ListOpsExample:
    """Picklable map: index -> one ListOps example, deterministic in (seed, index)."""

    tries = 100_000

    def __init__(self, seed, min_length, max_length, max_depth, max_args, branch_prob):
        self.seed = seed
        self.args = (min_length, max_length, max_depth, max_args, branch_prob)

    def draw(self, index, tries: int) -> dict | None:
        """Example `index`, or `None` if `tries` draws all fell outside the lengths."""
        min_length, max_length, max_depth, max_args, branch_prob = self.args
        rng = np.random.default_rng([self.seed, int(index)])
        for _ in range(tries):
            try:
                tokens, value = _listops_tree(
                    rng, 0, max_depth, max_args, branch_prob, [max_length]
                )
            except _TooLong:
                continue
            if len(tokens) >= min_length:
                return {"text": " ".join(tokens), "label": value}
        return None

    def __call__(self, index):
        example = self.draw(index, self.tries)
        if example is None:  # a length range that `listops`'s probe found drawable
            min_length, max_length = self.args[:2]
            raise RuntimeError(
                f"no ListOps sequence with {min_length}-{max_length} tokens in "
                f"{self.tries} tries for example {index}"
            )
        return example


@beartype
def listops(
    num_examples: IntLike,
    *,
    seed: IntLike = 0,
    min_length: IntLike = 500,
    max_length: IntLike = 2000,
    max_depth: IntLike = 9,
    max_args: IntLike = 10,
    branch_prob: RealLike = 0.25,
) -> grain.MapDataset:
    """The ListOps task of Long Range Arena, generated deterministically per seed.

    Expressions are prefix trees such as `[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]`
    with operators `MIN`, `MAX`, `MED` (median, rounded down) and `SM` (sum modulo 10)
    over digits; the label (10 classes) is the value of the whole expression. As in
    LRA, the root is an operator; below it a node is an operator with probability
    `branch_prob` (while fewer than `max_depth` operators enclose it) and a digit
    otherwise; operators take 2 to `max_args` arguments. Sequences outside
    `[min_length, max_length]` tokens are rejected and redrawn. The defaults draw LRA's
    trees: its generator counts the root at depth 1, so its `max_depth=10` nests at most
    9 operators; its length bounds are exclusive (`500 < length < 2000`), ours
    inclusive. Example `i` depends only on `(seed, i)`, and is generated lazily when
    read, so any split (`seed`) and any size is cheap.

    Encode with [`lineax_seq.ListOpsTokenizer`][] and
    `classification_dataset(..., add_special_tokens=False)`.

    **Arguments:**

    - `num_examples`: dataset size (LRA: 96k train / 2k valid / 2k test).
    - `seed`: use different seeds for different splits (an integer >= 0).
    - `min_length`, `max_length`: accepted token-count range.
    - `max_depth`: the most operators nested in one another, the root's included
        (`1`: the root alone, over digits).
    - `max_args`, `branch_prob`: the most arguments of an operator, and the
        probability that a node below the root is an operator.

    **Returns:**

    A `grain.MapDataset` of `{"text": str, "label": int}`.

    **Raises:**

    `ValueError` for out-of-range arguments, for a `min_length` longer than any
    expression of depth `max_depth` with `max_args` arguments per operator can be, and
    for a range `[min_length, max_length]` that no such expression's length falls in,
    or that 10,000 draws for the first example all miss (reachable, but improbable).
    Reading an example raises `RuntimeError` if 100,000 draws miss the range.
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
    shape = f"max_depth={max_depth}, max_args={max_args}"
    shape += " and branch_prob=0" if branch_prob == 0 else ""
    longest = _listops_max_tokens(max_depth, max_args, branch_prob)
    if min_length > longest:
        raise ValueError(
            f"min_length={min_length} cannot be reached: expressions with {shape} have at "
            f"most {longest} tokens"
        )
    lengths = np.flatnonzero(_listops_lengths(max_depth, max_args, branch_prob, max_length))
    if not (lengths >= min_length).any():
        raise ValueError(
            f"no expression with {shape} has between min_length={min_length} and "
            f"max_length={max_length} tokens (the longest up to max_length has "
            f"{lengths.max(initial=0)}); widen the range"
        )
    make = _ListOpsExample(seed, min_length, max_length, max_depth, max_args, branch_prob)
    probe = 10_000  # draws: a range that these miss would take seconds per example
    if make.draw(0, probe) is None:
        raise ValueError(
            f"expressions with {shape} rarely have between min_length={min_length} and "
            f"max_length={max_length} tokens: none of {probe} draws did (reachable, but "
            "each example would take seconds of redrawing); widen the range, or change "
            "branch_prob, max_depth or max_args towards it"
        )
    return grain.MapDataset.range(num_examples).map(make)
