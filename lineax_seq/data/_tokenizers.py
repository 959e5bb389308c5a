"""Tokenizers: a built-in byte-level tokenizer and a BPE tokenizer trained offline.

Every tokenizer in this package shares the same seven special tokens at the same ids, so
models and pipelines can switch between them without changes:

| id | token   | use                                   |
|----|---------|---------------------------------------|
| 0  | `<pad>` | padding (ignored by losses and masks) |
| 1  | `<bos>` | start of a document                   |
| 2  | `<eos>` | end of a document                     |
| 3  | `<unk>` | unknown symbol                        |
| 4  | `<cls>` | classification token (MLM / fine-tuning) |
| 5  | `<sep>` | segment separator                     |
| 6  | `<mask>`| masked-LM mask token                  |
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import tokenizers
from jaxtyping import Array, Int, Integer

from .._checks import IntLike, check_int, check_path, short_repr
from ._corpus import LONE_SURROGATE

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>", "<cls>", "<sep>", "<mask>")
PAD_ID = 0
"""Id of `<pad>`, the padding token, in every tokenizer."""
BOS_ID = 1
"""Id of `<bos>`, the beginning-of-sequence token, in every tokenizer."""
EOS_ID = 2
"""Id of `<eos>`, the end-of-sequence token, in every tokenizer."""
UNK_ID = 3
"""Id of `<unk>`, the unknown token, in every tokenizer."""
CLS_ID = 4
"""Id of `<cls>`, which starts every MLM and classification sequence, in every tokenizer."""
SEP_ID = 5
"""Id of `<sep>`, which ends a segment, in every tokenizer."""
MASK_ID = 6
"""Id of `<mask>`, the masked-LM mask token, in every tokenizer."""
NUM_SPECIAL = len(SPECIAL_TOKENS)

TokenIds = Integer[np.ndarray, " n"] | Integer[Array, " n"] | Sequence[int]


def check_ids(ids: TokenIds, vocab_size: int, name: str = "ids") -> np.ndarray:
    """`ids` as a 1-d int64 array, or an error naming the first id outside the vocabulary."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-d, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    # Compared in their own dtype: int64 would wrap uint64 ids >= 2**63 to negatives.
    bad = arr[(arr < 0) | (arr >= vocab_size)]
    if bad.size:
        raise ValueError(f"{name} must be in [0, vocab_size={vocab_size}), got id {int(bad[0])}")
    return arr.astype(np.int64)


def check_text(text: object, name: str = "text") -> str:
    """`text`, or a `TypeError` naming it unless it is a `str` (bytes are not text: a
    tokenizer would encode their repr, or fail inside), or a `ValueError` if it holds
    half of a surrogate pair (which has no UTF-8 encoding)."""
    if not isinstance(text, str):
        hint = " (decode bytes first, e.g. text.decode('utf-8'))" if isinstance(text, bytes) else ""
        raise TypeError(
            f"{name} must be a str, got {type(text).__name__} {name}={short_repr(text)}{hint}"
        )
    if half := LONE_SURROGATE.search(text):
        raise ValueError(
            f"{name} holds {half.group()!r} at index {half.start()}, half of a surrogate pair "
            "(e.g. an emoji cut in two), which is not text"
        )
    return text


def check_texts(texts: object) -> Iterable[object]:
    """`texts`, or a `TypeError` for `texts` not an iterable of documents, or a single
    `str`: a string is a sequence of strings too, and each of its characters would become
    a document."""
    if not isinstance(texts, Iterable):
        raise TypeError(
            f"texts must be a sequence of documents (str), got texts={short_repr(texts)}"
        )
    if isinstance(texts, str):
        raise TypeError(
            f"texts must be a sequence of documents, got a single str {texts[:30]!r}; "
            "pass [text] for one document"
        )
    return texts


def check_texts_list(texts: object) -> list[str]:
    """`texts` as a list of `str`, checked as by `check_texts` and `check_text`, each
    document named by its index (`texts[i]`)."""
    return [check_text(t, f"texts[{i}]") for i, t in enumerate(check_texts(texts))]


@runtime_checkable
class Tokenizer(Protocol):
    """What the pipelines need from a tokenizer.

    Implemented by [`lineax_seq.ByteTokenizer`][], [`lineax_seq.BPETokenizer`][] and
    [`lineax_seq.ListOpsTokenizer`][]. All three put the special tokens at ids 0-6
    (`pad, bos, eos, unk, cls, sep, mask`), so the `*_id` attributes agree (the three
    also have `unk_id`, 3, which the pipelines do not need).
    """

    @property
    def vocab_size(self) -> int:
        """Number of token ids, special tokens included."""
        ...

    @property
    def special_ids(self) -> tuple[int, ...]:
        """The ids of the special tokens, `(0, 1, ..., 6)`."""
        ...

    @property
    def pad_id(self) -> int:
        """Id of `<pad>` (0): padding of MLM and classification sequences."""
        ...

    @property
    def bos_id(self) -> int:
        """Id of `<bos>` (1): starts every causal-LM document."""
        ...

    @property
    def eos_id(self) -> int:
        """Id of `<eos>` (2): ends every causal-LM document."""
        ...

    @property
    def cls_id(self) -> int:
        """Id of `<cls>` (4): starts every MLM and classification sequence."""
        ...

    @property
    def sep_id(self) -> int:
        """Id of `<sep>` (5): ends a segment."""
        ...

    @property
    def mask_id(self) -> int:
        """Id of `<mask>` (6): the masked-LM mask token."""
        ...

    def encode(self, text: str) -> np.ndarray:
        """Token ids of `text` (int32, shape `(n,)`), without special tokens."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`encode` of every text of `texts`: a list of int32 arrays of shape `(n_i,)`."""
        ...

    def decode(self, ids: TokenIds) -> str:
        """The text of token ids `(n,)`, special tokens dropped; ids outside
        `[0, vocab_size)` raise a `ValueError`."""
        ...


class _SpecialIds:
    """Mixin: the shared special-token ids as attributes."""

    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID
    cls_id: int = CLS_ID
    sep_id: int = SEP_ID
    mask_id: int = MASK_ID

    @property
    def special_ids(self) -> tuple[int, ...]:
        """The ids of the special tokens, `(0, 1, ..., 6)`."""
        return tuple(range(NUM_SPECIAL))


class ByteTokenizer(_SpecialIds):
    """Byte-level tokenizer: UTF-8 byte `b` is token `b + 7`; 263 tokens in all.

    Needs no training and never produces `<unk>`. Special tokens are ids 0-6 (see the
    module table); `decode` drops them and replaces invalid UTF-8 with U+FFFD.
    """

    offset: int = NUM_SPECIAL

    @property
    def vocab_size(self) -> int:
        """`256 + 7 = 263`."""
        return 256 + NUM_SPECIAL

    def encode(self, text: str) -> Int[np.ndarray, " n"]:
        """Encode `text` as int32 token ids (no special tokens added).

        **Arguments:**

        - `text`: a string.

        **Returns:**

        An int32 array of shape `(n,)`, `n` the number of UTF-8 bytes of `text`.
        """
        text = check_text(text)
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32) + self.offset

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`[encode(t) for t in texts]`, int32 arrays of shape `(n_i,)` (a single `str` is a
        `TypeError`)."""
        return [self.encode(t) for t in check_texts_list(texts)]

    def decode(self, ids: TokenIds) -> str:
        """Decode token ids to text, dropping special tokens.

        **Arguments:**

        - `ids`: token ids `(n,)` (any integer iterable or array) in `[0, vocab_size)`;
            others raise a `ValueError`.

        **Returns:**

        The decoded string.
        """
        arr = check_ids(ids, self.vocab_size)
        arr = arr[arr >= self.offset] - self.offset
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=263)"


class BPETokenizer(_SpecialIds):
    """Byte-level BPE tokenizer (the `tokenizers` library), trained offline on a corpus.

    Build one with [`lineax_seq.BPETokenizer.train`][] or
    [`lineax_seq.BPETokenizer.load`][]; save with `save`. Special tokens are ids 0-6
    as for every tokenizer here; no special tokens are added by `encode`, and text is
    encoded literally: a `"<mask>"` in the text is its characters, never the special
    id (so `decode(encode(text)) == text`).
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer):
        """**Arguments:**

        - `tokenizer`: a `tokenizers.Tokenizer` with the special tokens `<pad>`, `<bos>`,
          `<eos>`, `<unk>`, `<cls>`, `<sep>`, `<mask>` at ids 0-6 (as `train` makes
          them), and ids `0 .. vocab_size - 1` without gaps; it is copied, without its
          truncation and padding (documents are encoded whole; the pipelines pad). Its
          normalizer and pre-tokenizer are kept: one that changes the text (lowercasing,
          an added prefix space) breaks `decode(encode(text)) == text`.

        **Raises:**

        `TypeError` for anything else than a `tokenizers.Tokenizer`; `ValueError` if a
        special token is missing or at another id, or an id is missing.
        """
        from tokenizers import Tokenizer as _HFTokenizer

        if not isinstance(tokenizer, _HFTokenizer):
            raise TypeError(
                f"tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer).__name__}"
            )
        for i, tok in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(tok) != i:
                raise ValueError(
                    f"tokenizer must have special token {tok!r} at id {i}, "
                    f"got id {tokenizer.token_to_id(tok)}"
                )
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        if unused := sorted(set(range(len(vocab))) - set(vocab.values())):
            raise ValueError(
                f"tokenizer's {len(vocab)} tokens must have the ids 0..{len(vocab) - 1}, "
                f"but ids {unused[:5]} are unused (largest id {max(vocab.values())})"
            )
        # A copy: special ids come from the pipelines only, and the caller's tokenizer
        # keeps its own `encode_special_tokens`. Without truncation or padding: a
        # document is encoded whole, and the pipelines pad.
        tokenizer = _HFTokenizer.from_str(tokenizer.to_str())
        tokenizer.encode_special_tokens = True
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tok = tokenizer

    def __getstate__(self) -> dict[str, str]:
        # `tokenizers` does not carry `encode_special_tokens` through pickle or deepcopy
        # (grain's worker processes pickle the pipeline): rebuild through `__init__`.
        return {"json": self._tok.to_str()}

    def __setstate__(self, state: dict[str, str]) -> None:
        from tokenizers import Tokenizer as _HFTokenizer

        self.__init__(_HFTokenizer.from_str(state["json"]))

    @classmethod
    def train(
        cls, texts: Iterable[str], *, vocab_size: IntLike = 32_000, min_frequency: IntLike = 2
    ) -> BPETokenizer:
        """Train a byte-level BPE tokenizer on `texts`.

        **Arguments:**

        - `texts`: training documents (e.g. `text_corpus(split="train")`; a single
            `str`, or a document that is not a `str`, is a `TypeError`).
        - `vocab_size`: size of the vocabulary including the 7 special tokens and the
            256 byte symbols (the papers use 32k). Must be at least 263.
        - `min_frequency`: minimum pair count for a merge (an integer >= 0).

        **Returns:**

        A `BPETokenizer`.
        """
        from tokenizers import Tokenizer as _HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        check_texts(texts)
        vocab_size = check_int("vocab_size", vocab_size)
        min_frequency = check_int("min_frequency", min_frequency, minimum=0)
        if vocab_size < 256 + NUM_SPECIAL:
            raise ValueError(
                f"vocab_size must be >= {256 + NUM_SPECIAL} (7 special tokens + 256 bytes), "
                f"got {vocab_size}"
            )
        tok = _HFTokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        # Each document checked as read (`texts` may stream): `tokenizers` takes a list of
        # strings for a batch of documents, so it would train a dict's keys, or a list's.
        read = 0

        def documents():
            nonlocal read
            for i, text in enumerate(texts):
                read += 1
                yield check_text(text, f"texts[{i}]")

        tok.train_from_iterator(documents(), trainer=trainer)
        if not read:
            raise ValueError("texts is empty: a BPE tokenizer needs documents to train on")
        return cls(tok)

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Load a tokenizer saved with `save` (a `tokenizers` JSON file).

        **Arguments:**

        - `path`: the JSON file.

        **Returns:**

        A `BPETokenizer`.

        **Raises:**

        `FileNotFoundError` for a missing file, `ValueError` naming it for one that is not
        a tokenizer saved by `save`.
        """
        if not check_path("path", path).is_file():
            raise FileNotFoundError(f"path {str(path)!r} is not a tokenizer JSON file")
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        return cls._from_str(text, f"path {str(path)!r}")

    def save(self, path: str | os.PathLike) -> None:
        """Write the tokenizer to `path` as JSON (atomically: temporary file + rename)."""
        if check_path("path", path).is_dir():
            raise IsADirectoryError(f"path {str(path)!r} is a directory, expected a file name")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"path {str(path)!r}: its directory {parent!r} does not exist")
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self._tok.to_str())
        os.replace(tmp, path)

    def to_json(self) -> str:
        """The tokenizer as a JSON string."""
        return self._tok.to_str()

    @classmethod
    def from_json(cls, text: str) -> BPETokenizer:
        """Inverse of `to_json` (a `ValueError` for text that is not such a tokenizer)."""
        return cls._from_str(text, "text")

    @classmethod
    def _from_str(cls, text: str, source: str) -> BPETokenizer:
        from tokenizers import Tokenizer as _HFTokenizer

        try:
            json.loads(text)
            tokenizer = _HFTokenizer.from_str(text)
        except Exception as e:  # the Rust library raises a bare `Exception`
            raise ValueError(
                f"{source} is not a tokenizer saved by BPETokenizer.save: {e}"
            ) from None
        try:
            return cls(tokenizer)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    @property
    def vocab_size(self) -> int:
        """Number of tokens, special tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> Int[np.ndarray, " n"]:
        """Encode `text` as int32 token ids (no special tokens added).

        **Arguments:**

        - `text`: a string.

        **Returns:**

        An int32 array of shape `(n,)`.
        """
        text = check_text(text)
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode many texts at once: int32 arrays of shape `(n_i,)` (parallel in the Rust
        library; a single `str` is a `TypeError`)."""
        encs = self._tok.encode_batch(check_texts_list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encs]

    def decode(self, ids: TokenIds) -> str:
        """Decode token ids `(n,)` to text, dropping special tokens (ids outside
        `[0, vocab_size)` raise a `ValueError`)."""
        ids = check_ids(ids, self.vocab_size)
        return self._tok.decode(ids.tolist(), skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"
