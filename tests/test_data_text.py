"""Text pipelines: corpus + split, tokenizers, causal-LM windows, MLM masking, the loader."""

import copy
import hashlib
import inspect
import json
import pickle

import grain
import numpy as np
import pytest

import lineax_seq as ls

DOCS = [
    "def f(x):\n    return x + 1\n" * 3,
    "héllo wörld — ünïcode ✓",
    "short",
    "a" * 97,
    "the quick brown fox jumps over the lazy dog. " * 5,
]


# ----------------------------------------------------------------------------- corpus


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    (root / "sub").mkdir()
    for i in range(30):
        (root / "sub" / f"doc{i}.txt").write_text(f"document number {i}\n" * (i + 1))
    (root / "code.py").write_text("print('hi')\n")
    (root / "empty.txt").write_text("   \n")
    (root / "ignored.md").write_text("not a corpus file")
    with open(root / "records.jsonl", "w") as f:
        for i in range(10):
            f.write(json.dumps({"text": f"json record {i}"}) + "\n")
    return root


def test_default_corpus_is_stdlib_and_split_is_a_partition():
    full = ls.text_corpus(split="all")
    parts = [ls.text_corpus(split=s) for s in ("train", "valid", "test")]
    assert len(full) > 500
    assert sum(len(p) for p in parts) == len(full)
    assert 0.02 < len(parts[1]) / len(full) < 0.1  # about valid_fraction = 0.05
    texts = [set(p[i] for i in range(len(p))) for p in parts]
    assert not (texts[0] & texts[1]) and not (texts[0] & texts[2])
    assert any("import " in full[i] for i in range(20))


def test_user_corpus_and_deterministic_split(corpus_dir):
    full = ls.text_corpus(corpus_dir, split="all")
    assert len(full) == 30 + 1 + 10  # empty.txt dropped, .md ignored
    a = ls.text_corpus(corpus_dir, split="valid", valid_fraction=0.3, test_fraction=0.3)
    b = ls.text_corpus(corpus_dir, split="valid", valid_fraction=0.3, test_fraction=0.3)
    assert [a[i] for i in range(len(a))] == [b[i] for i in range(len(b))]
    # A document's split depends on its id only, not on the other documents present.
    single = ls.text_corpus(corpus_dir / "sub", split="all")
    assert len(single) == 30
    from lineax_seq.data._corpus import split_of

    assert split_of("x.py", valid_fraction=0.05, test_fraction=0.05) == split_of(
        "x.py", valid_fraction=0.05, test_fraction=0.05
    )
    ids = [f"doc{i}" for i in range(4000)]
    frac = np.mean([split_of(d, valid_fraction=0.2, test_fraction=0.1) == "valid" for d in ids])
    assert abs(frac - 0.2) < 0.03
    # The documented rule: u = blake2b-64(id) / 2^64; [0, valid) valid, then test, then train.
    for d in ids[:400]:
        u = int.from_bytes(hashlib.blake2b(d.encode(), digest_size=8).digest(), "little") / 2**64
        want = "valid" if u < 0.2 else "test" if u < 0.3 else "train"
        assert split_of(d, valid_fraction=0.2, test_fraction=0.1) == want, d


def test_jsonl_lines_without_ids_keep_their_split(tmp_path):
    """A JSONL line without an id is named by its text: a line inserted before it moves no
    document between splits (line numbers moved 38 of 44 test documents to train), and a
    repeated line, in the same file or another, is one document, in one split."""
    lines = [json.dumps({"text": f"record {i} " + "x" * (i % 5)}) for i in range(300)]
    kw = dict(valid_fraction=0.1, test_fraction=0.1)

    def splits(content, other=()):
        (tmp_path / "c.jsonl").write_text("\n".join(content) + "\n")
        (tmp_path / "d.jsonl").write_text("".join(f"{line}\n" for line in other))
        parts = ("train", "valid", "test")
        return {s: list(ls.text_corpus(tmp_path, split=s, **kw)) for s in parts}

    before = splits(lines)
    after = splits([json.dumps({"text": "a new first record"}), "", *lines, lines[7]], lines[:50])
    assert all(set(before[s]) <= set(after[s]) for s in before)
    assert sum(len(after[s]) for s in after) == 301
    assert len(before["test"]) > 15 and len(before["valid"]) > 15


def test_single_text_file_is_split_by_position(tmp_path):
    """One `.txt` file (a book): train, valid, test are consecutive parts of it."""
    book = tmp_path / "book.txt"
    lines = [f"line {i:03d} " + "x" * (i % 7) + "\n" for i in range(400)]
    book.write_text("".join(lines))
    parts = [ls.text_corpus(book, split=s, valid_fraction=0.1, test_fraction=0.2)[0]
             for s in ("train", "valid", "test")]  # fmt: skip
    assert "".join(parts) == book.read_text() == ls.text_corpus(book, split="all")[0]
    assert all(p.startswith("line ") and p.endswith("\n") for p in parts)  # cut at lines
    sizes = np.array([len(p) for p in parts]) / len(book.read_text())
    np.testing.assert_allclose(sizes, [0.7, 0.1, 0.2], atol=0.01)
    # A text without line breaks is cut mid-line rather than leaving a split empty.
    flat = tmp_path / "flat.txt"
    flat.write_text("a" * 1000)
    valid = ls.text_corpus(flat, split="valid")[0]
    assert len(valid) == 50
    # Nor does one long line ending in a line break; Windows line endings read as \n.
    flat.write_text("a" * 1000 + "\n")
    assert [len(ls.text_corpus(flat, split=s)[0]) for s in ("train", "valid", "test")] == [
        901,
        50,
        50,
    ]
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes("".join(lines).replace("\n", "\r\n").encode())
    assert ls.text_corpus(crlf, split="valid")[0] == ls.text_corpus(book, split="valid")[0]
    # A split that the file is too short to fill is an error that says why.
    short = tmp_path / "short.txt"
    short.write_text("print('hi')\n")
    with pytest.raises(ValueError, match=r"split='valid' .* by position, .* 12 characters"):
        ls.text_corpus(short, split="valid")


def test_corpus_directory_scan(tmp_path):
    """Linked folders are read (once, a link cycle is no loop), hidden ones are not (a
    project's `.venv` would add thousands of files); any file may start with a BOM, and
    suffixes match in any case."""
    real = tmp_path / "shards"
    real.mkdir()
    (real / "a.txt").write_text("alpha")
    (real / "b.py").write_text("beta = 1")
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "top.txt").write_text("top")
    (root / "linked").symlink_to(real, target_is_directory=True)
    (root / "again").symlink_to(real, target_is_directory=True)  # the same folder twice
    (root / "loop").symlink_to(root, target_is_directory=True)  # a cycle
    for hidden in (".venv", ".git"):
        (root / hidden).mkdir()
        (root / hidden / "lib.py").write_text("hidden = True")
    (root / ".notes.txt").write_text("hidden")
    (root / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "with bom"}\n')
    docs = sorted(ls.text_corpus(root, split="all"))
    assert docs == ["alpha", "beta = 1", "top", "with bom"]
    bom = tmp_path / "upper"
    bom.mkdir()
    (bom / "A.TXT").write_bytes(b"\xef\xbb\xbfheader\r\nline\r\n")
    assert list(ls.text_corpus(bom, split="all")) == ["header\nline\n"]
    assert list(ls.text_corpus(bom / "A.TXT", split="all")) == ["header\nline\n"]
    # A link into the tree does not rename the documents of the folder it points to,
    # and a link to an ancestor does not pull in the folders around the corpus.
    (root / "sub").mkdir()
    (root / "sub" / "doc.txt").write_text("in sub")
    (root / "a_link").symlink_to(root / "sub", target_is_directory=True)
    (root / "up").symlink_to(tmp_path, target_is_directory=True)
    ids = [doc_id for doc_id, _ in ls.data._corpus.read_documents(root)]
    assert "sub/doc.txt" in ids and not any(i.startswith(("a_link/", "up/")) for i in ids)
    assert len(ids) == 5
    # A link to a file is read only if nothing else reaches that file (else its text
    # would be a second document, maybe in another split).
    (root / "latest.txt").symlink_to(root / "top.txt")
    (root / "z.txt").symlink_to(real / "a.txt")  # read through "linked/" already
    outside = tmp_path / "outside.txt"
    outside.write_text("outside")
    (root / "o1.txt").symlink_to(outside)
    (root / "o2.txt").symlink_to(outside)
    ids = [doc_id for doc_id, _ in ls.data._corpus.read_documents(root)]
    assert "top.txt" in ids and "o1.txt" in ids and len(ids) == 6


def test_corpus_exclude(tmp_path, no_jaxtyping):
    """`exclude` leaves out files and whole folders, matched by real path, also where a
    link elsewhere in the tree reaches them; missing paths are ignored, a lone path (a
    string is a sequence of characters) is an error."""
    root = tmp_path / "corpus"
    (root / "outputs" / "run").mkdir(parents=True)
    (root / "keep.txt").write_text("keep")
    (root / "drop.txt").write_text("drop")
    (root / "outputs" / "run" / "metrics.jsonl").write_text('{"loss": 1.0}\n')
    (root / "outputs" / "notes.txt").write_text("notes")
    (root / "link.txt").symlink_to(root / "outputs" / "run" / "metrics.jsonl")
    with pytest.raises(ValueError, match="metrics.jsonl:1: JSON object has no 'text'"):
        ls.text_corpus(root, split="all")
    run = root / "outputs" / "run"
    docs = ls.text_corpus(root, split="all", exclude=[run, root / "drop.txt", tmp_path / "no"])
    assert sorted(docs) == ["keep", "notes"]
    via_link = tmp_path / "alias"
    via_link.symlink_to(root, target_is_directory=True)
    assert sorted(ls.text_corpus(root, split="all", exclude=(via_link / "outputs",))) == [
        "drop",
        "keep",
    ]
    ids = [i for i, _ in ls.data._corpus.read_documents(root, exclude=[run, root / "drop.txt"])]
    assert ids == ["keep.txt", "outputs/notes.txt"]
    # A folder holding the corpus (an --out above --corpus) excludes nothing.
    holders = [root, tmp_path, run]
    assert list(ls.text_corpus(root / "outputs", split="all", exclude=holders)) == ["notes"]
    for lone in (str(run), run):
        with pytest.raises(TypeError, match="exclude must be a sequence of paths"):
            ls.text_corpus(root, exclude=lone)
    with pytest.raises(ValueError, match="exclude holds '', which is not a path"):
        ls.text_corpus(root, exclude=[""])
    with pytest.raises(TypeError, match="exclude must be a path"):
        ls.text_corpus(root, exclude=[3])


def test_corpus_bad_inputs(tmp_path, corpus_dir):
    with pytest.raises(FileNotFoundError, match="source"):
        ls.text_corpus(tmp_path / "missing")
    with pytest.raises(ValueError, match="source='' is not a path"):  # not the cwd's files
        ls.text_corpus("")
    empty = tmp_path / "emptydir"
    empty.mkdir()
    with pytest.raises(ValueError, match="source .* no"):
        ls.text_corpus(empty)
    (tmp_path / "blank.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="only empty documents"):
        ls.text_corpus(tmp_path / "blank.txt")
    with pytest.raises(ValueError, match="split must be one of"):
        ls.text_corpus(corpus_dir, split="dev")
    with pytest.raises(ValueError, match="valid_fraction"):
        ls.text_corpus(corpus_dir, valid_fraction=0.7, test_fraction=0.5)
    with pytest.raises(ValueError, match="split='test' .* has no documents"):
        ls.text_corpus(corpus_dir / "code.py", split="test")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: .*'text'"):
        ls.text_corpus(bad, split="all")
    bad.write_text('{"text": "x"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a JSON object \(got list\)"):
        ls.text_corpus(bad, split="all")
    with pytest.raises(ValueError, match="'/dev/null' is neither a regular file nor a directory"):
        ls.text_corpus("/dev/null")


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([{"text": None}], r"n.jsonl:1: field 'text' must be a string, got None"),
        ([{"text": "a"}, {"text": 5}], r"n.jsonl:2: field 'text' must be a string, got 5"),
        ([{"id": None, "text": "a"}], r"n.jsonl:1: field 'id' must be a string or an integer"),
        (
            [{"id": "x", "text": "a"}, {"id": "x", "text": "b"}],
            r"n.jsonl:2: duplicate document id 'x' \(first at .*n.jsonl:1\)",
        ),
    ],
)
def test_corpus_jsonl_bad_records(tmp_path, records, message):
    path = tmp_path / "n.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match=message):
        ls.text_corpus(path, split="all")


def test_corpus_jsonl_half_surrogates_are_replaced(tmp_path):
    """Half an emoji, as json.dumps escapes it ("\\ud83d"), reads as U+FFFD, like invalid
    bytes: no tokenizer encodes it (nor hashes it as an id)."""
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"id": "\udc00", "text": "cut \ud83d here"}) + "\n")
    (doc,) = ls.text_corpus(path, split="all")
    assert doc == "cut \ufffd here"
    split = ls.data._corpus.split_of("\udc00", valid_fraction=0.3, test_fraction=0.3)
    assert ls.text_corpus(path, split=split, valid_fraction=0.3, test_fraction=0.3)[0] == doc
    for tok in (ls.ByteTokenizer(), ls.BPETokenizer.train(DOCS, vocab_size=270)):
        assert tok.decode(tok.encode(doc)) == doc


# -------------------------------------------------------------------------- tokenizers


def test_byte_tokenizer_roundtrip_and_ids():
    tok = ls.ByteTokenizer()
    assert isinstance(tok, ls.Tokenizer)
    assert tok.vocab_size == 263
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert (tok.cls_id, tok.sep_id, tok.mask_id) == (4, 5, 6)
    for text in DOCS:
        ids = tok.encode(text)
        assert ids.dtype == np.int32 and ids.min() >= 7 and ids.max() < 263
        assert tok.decode(ids) == text
        assert tok.decode(np.concatenate([[1, 4], ids, [2, 0, 0]])) == text
    assert list(tok.encode("A")) == [65 + 7]
    # Every code point below 256 (NUL and two-byte UTF-8 among them) comes back.
    text = "".join(map(chr, range(256)))
    assert tok.decode(tok.encode(text)) == text
    for bad in (263, -1):
        with pytest.raises(
            ValueError, match=f"ids must be in \\[0, vocab_size=263\\), got id {bad}"
        ):
            tok.decode([72, bad])


def test_bpe_train_save_load(tmp_path):
    texts = [t * 4 for t in DOCS] * 5
    tok = ls.BPETokenizer.train(texts, vocab_size=320, min_frequency=1)
    assert isinstance(tok, ls.Tokenizer)
    assert 263 < tok.vocab_size <= 320
    assert tok.special_ids == ls.ByteTokenizer().special_ids
    ids = tok.encode(DOCS[4])
    assert len(ids) < len(DOCS[4].encode())  # merges compress
    assert tok.decode(ids) == DOCS[4] and tok.decode(tok.encode(DOCS[1])) == DOCS[1]
    assert ids.min() >= 7  # no special token produced by encode
    path = tmp_path / "bpe.json"
    tok.save(path)
    loaded = ls.BPETokenizer.load(path)
    for text in DOCS:
        np.testing.assert_array_equal(loaded.encode(text), tok.encode(text))
    batch = loaded.encode_batch(DOCS)
    for text, ids in zip(DOCS, batch, strict=True):
        np.testing.assert_array_equal(ids, tok.encode(text))
    # Text is encoded literally: special-token strings in it are not special ids.
    literal = "re.sub('(?P<unk>x)') <mask> <pad>"
    assert tok.decode(tok.encode(literal)) == literal
    assert loaded.decode(loaded.encode(literal)) == literal
    assert tok.encode(literal).min() >= 7
    # Wrapping a `tokenizers.Tokenizer` leaves the caller's object as it was.
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(path))
    before = raw.encode("<mask>").ids
    assert ls.BPETokenizer(raw).encode("<mask>").min() >= 7
    assert raw.encode("<mask>").ids == before == [ls.MASK_ID]
    # So are copies' (grain's worker processes pickle the pipeline; `tokenizers` drops
    # the literal-encoding flag when pickled).
    for copied in (pickle.loads(pickle.dumps(tok)), copy.deepcopy(tok)):
        np.testing.assert_array_equal(copied.encode(literal), tok.encode(literal))
    # A tokenizer saved with truncation and padding on encodes documents whole and
    # unpadded (they cut every document to 4 tokens and padded batches with <pad>).
    raw.enable_truncation(max_length=4)
    raw.enable_padding(pad_id=ls.PAD_ID, pad_token="<pad>")
    raw.save(str(tmp_path / "cut.json"))
    for wrapped in (ls.BPETokenizer(raw), ls.BPETokenizer.load(tmp_path / "cut.json")):
        assert wrapped.decode(wrapped.encode(DOCS[4])) == DOCS[4]
        short, long = wrapped.encode_batch(["hi", DOCS[4]])
        np.testing.assert_array_equal(short, tok.encode("hi"))
        np.testing.assert_array_equal(long, tok.encode(DOCS[4]))
    with pytest.raises(ValueError, match=f"got id {tok.vocab_size}"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="vocab_size must be >= 263"):
        ls.BPETokenizer.train(texts, vocab_size=100)
    for empty in ([], iter(())):  # it gave a tokenizer of the 263 base tokens
        with pytest.raises(ValueError, match="texts is empty"):
            ls.BPETokenizer.train(empty, vocab_size=300)
    with pytest.raises(FileNotFoundError, match="path"):
        ls.BPETokenizer.load(tmp_path / "nope.json")


def test_tokenizer_protocol_needs_the_special_ids():
    class Incomplete:
        vocab_size = 263
        special_ids = tuple(range(7))
        encode = ls.ByteTokenizer.encode
        encode_batch = ls.ByteTokenizer.encode_batch
        decode = ls.ByteTokenizer.decode

    assert not isinstance(Incomplete(), ls.Tokenizer)
    for name in ("pad_id", "bos_id", "eos_id", "cls_id", "sep_id", "mask_id"):
        setattr(Incomplete, name, getattr(ls.ByteTokenizer, name))
    assert isinstance(Incomplete(), ls.Tokenizer)


# ---------------------------------------------------------------------- causal-LM windows


def _reference_windows(docs, tok, length, stride):
    out = []
    for d in docs:
        seq = [tok.bos_id] + list(tok.encode(d)) + [tok.eos_id]
        s = 0
        while s + length + 1 <= len(seq):
            out.append(seq[s : s + length + 1])
            s += stride
    return out


@pytest.mark.parametrize("length,stride", [(1, None), (7, None), (16, 5), (100, None)])
def test_lm_windows_match_reference(length, stride):
    tok = ls.ByteTokenizer()
    ds = ls.lm_windows(DOCS, tok, length=length, stride=stride)
    ref = _reference_windows(DOCS, tok, length, stride or length)
    assert len(ds) == len(ref) > 0
    for i, w in enumerate(ref):
        ex = ds[i]
        assert ex["inputs"].shape == ex["targets"].shape == (length,)
        np.testing.assert_array_equal(ex["inputs"], w[:-1])
        np.testing.assert_array_equal(ex["targets"], w[1:])


def test_lm_windows_take_a_document_of_exactly_length_plus_one_tokens():
    """`<bos> abc <eos>` is 5 tokens: one window at length 4, none from shorter ones."""
    tok = ls.ByteTokenizer()
    ds = ls.lm_windows(["ab", "abc"], tok, length=4)
    assert len(ds) == 1
    seq = [tok.bos_id, *tok.encode("abc"), tok.eos_id]
    np.testing.assert_array_equal(ds[0]["inputs"], seq[:-1])
    np.testing.assert_array_equal(ds[0]["targets"], seq[1:])


def test_lm_dataset_batches_any_length():
    tok = ls.ByteTokenizer()
    texts = ls.text_corpus(split="valid")
    for length in (32, 512):  # e.g. training length and 16x it
        it = iter(ls.lm_dataset(texts, tok, length=length, batch_size=3))
        batch = next(it)
        assert batch["inputs"].shape == batch["targets"].shape == (3, length)
        assert batch["inputs"].dtype == np.int32
        np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])


def test_lm_bad_inputs():
    tok = ls.ByteTokenizer()
    with pytest.raises(ValueError, match="length=1000 .* longest document has 227 tokens"):
        ls.lm_windows(DOCS, tok, length=1000)
    with pytest.raises(ValueError, match="texts has no documents"):
        ls.lm_windows([], tok, length=2)
    with pytest.raises(ValueError, match="length must be a positive integer, got length="):
        ls.lm_windows(DOCS, tok, length=0)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got batch_size=0"):
        ls.lm_dataset(DOCS, tok, length=8, batch_size=0)
    with pytest.raises(ValueError, match="batch_size=1000 is larger"):
        ls.lm_dataset(DOCS, tok, length=8, batch_size=1000, num_epochs=1)
    with pytest.raises(TypeError, match="texts must be a sequence of documents, got a single"):
        ls.lm_windows("abcdefghijkl", tok, length=4)


# --------------------------------------------------------------------------------- MLM


def test_mask_tokens_exact_and_statistics():
    tok = ls.ByteTokenizer()
    specials = tok.special_ids
    rng = np.random.default_rng(0)
    counts = {"mask": 0, "random": 0, "same": 0}
    n_seq = 3000
    for _ in range(n_seq):
        n = int(rng.integers(30, 61))
        body = rng.integers(7, 263, size=n)
        seq = np.concatenate([[4], body, [5], np.zeros(64 - n - 2, int)]).astype(np.int32)
        masked, labels = ls.mask_tokens(
            seq, rng, vocab_size=263, mask_id=tok.mask_id, special_ids=specials
        )
        chosen = labels != ls.IGNORE_INDEX
        assert chosen.sum() == max(1, round(0.15 * n))  # exactly 15% of non-special tokens
        assert not chosen[np.isin(seq, specials)].any()  # specials / padding never chosen
        np.testing.assert_array_equal(labels[chosen], seq[chosen])
        np.testing.assert_array_equal(masked[~chosen], seq[~chosen])  # rest untouched
        m = masked[chosen]
        counts["mask"] += int((m == tok.mask_id).sum())
        rand = (m != tok.mask_id) & (m != seq[chosen])
        assert not np.isin(m[rand], specials).any()
        counts["random"] += int(rand.sum())
        # a random draw equal to the original counts as "same": expected 1/256 of 10%
        counts["same"] += int((m == seq[chosen]).sum())
    total = sum(counts.values())
    assert total > 18_000
    assert abs(counts["mask"] / total - 0.8) < 0.01
    assert abs(counts["random"] / total - 0.1 * 255 / 256) < 0.008
    assert abs(counts["same"] / total - (0.1 + 0.1 / 256)) < 0.008


def test_mask_tokens_no_candidates():
    seq = np.array([4, 5, 0, 0], np.int32)
    masked, labels = ls.mask_tokens(
        seq, np.random.default_rng(0), vocab_size=263, mask_id=6, special_ids=range(7)
    )
    np.testing.assert_array_equal(masked, seq)
    assert (labels == ls.IGNORE_INDEX).all()
    with pytest.raises(ValueError, match=r"tokens must be in \[0, vocab_size=263\), got id -1"):
        ls.mask_tokens(
            np.array([9, -1]), np.random.default_rng(0), vocab_size=263, mask_id=6,
            special_ids=range(7),
        )  # fmt: skip


def _epochs(ds, n_batches):
    it = iter(ds)
    return [next(it) for _ in range(n_batches)]


def test_mlm_dataset_examples_and_masking_modes():
    tok = ls.ByteTokenizer()
    examples = ls.mlm_examples(DOCS, tok, length=16)
    ex = examples[len(examples) - 1]  # last chunk of the last document: padded
    assert ex["tokens"][0] == tok.cls_id
    n_real = int(ex["padding_mask"].sum())
    assert ex["tokens"][n_real - 1] == tok.sep_id and (ex["tokens"][n_real:] == 0).all()
    # Chunks tile every document exactly.
    body = [e["tokens"][1 : int(e["padding_mask"].sum()) - 1] for e in examples]
    np.testing.assert_array_equal(
        np.concatenate(body), np.concatenate([tok.encode(d) for d in DOCS])
    )
    n = len(examples)
    kwargs = dict(length=16, batch_size=n, shuffle=False, num_epochs=2, seed=3)
    fixed = _epochs(ls.mlm_dataset(DOCS, tok, masking="fixed", **kwargs), 2)
    dynamic = _epochs(ls.mlm_dataset(DOCS, tok, masking="dynamic", **kwargs), 2)
    np.testing.assert_array_equal(fixed[0]["tokens"], fixed[1]["tokens"])
    np.testing.assert_array_equal(fixed[0]["labels"], fixed[1]["labels"])
    assert (dynamic[0]["labels"] != dynamic[1]["labels"]).any()
    for b in fixed + dynamic:
        assert b["tokens"].shape == b["labels"].shape == b["padding_mask"].shape == (n, 16)
        assert not (b["labels"][~b["padding_mask"]] != ls.IGNORE_INDEX).any()
    # Fixed masks follow the example through a different shuffle each epoch.
    shuffled = _epochs(ls.mlm_dataset(DOCS, tok, masking="fixed", **{**kwargs, "shuffle": True}), 2)
    by_example = []
    for b in shuffled:
        original = np.where(b["labels"] != ls.IGNORE_INDEX, b["labels"], b["tokens"])
        keys = [o.tobytes() for o in original]
        by_example.append(
            {k: t.tobytes() for k, t in zip(keys, b["tokens"], strict=True) if keys.count(k) == 1}
        )
    assert len(by_example[0]) > n // 2
    assert by_example[0] == by_example[1]
    assert (shuffled[0]["tokens"] != shuffled[1]["tokens"]).any()  # order did change
    again = _epochs(ls.mlm_dataset(DOCS, tok, masking="dynamic", **kwargs), 2)
    other = _epochs(ls.mlm_dataset(DOCS, tok, masking="dynamic", **{**kwargs, "seed": 4}), 1)
    for a, b in zip(dynamic, again, strict=True):  # deterministic per seed
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
    assert (other[0]["labels"] != dynamic[0]["labels"]).any()
    with pytest.raises(
        ValueError, match=r"masking must be one of \('dynamic', 'fixed'\), got masking='static'"
    ):
        ls.mlm_dataset(DOCS, tok, length=16, batch_size=2, masking="static")
    with pytest.raises(ValueError, match="mask_prob must be in"):
        ls.mlm_dataset(DOCS, tok, length=16, batch_size=2, mask_prob=1.5)
    with pytest.raises(ValueError, match="length must be an integer >= 3"):
        ls.mlm_examples(DOCS, tok, length=2)


def test_mlm_examples_pack_documents():
    # RoBERTa's FULL-SENTENCES: one stream, <sep> between documents (empty ones add
    # none), cut into full chunks; only the last is padded.
    tok = ls.ByteTokenizer()
    docs = ["", *DOCS[1:3], "", "x"]
    packed = ls.mlm_examples(docs, tok, length=8, pack=True)
    sep = [tok.sep_id]
    stream = np.concatenate([tok.encode(docs[1]), sep, tok.encode(docs[2]), sep, tok.encode("x")])
    assert len(packed) == -(-stream.size // 6)
    body = [e["tokens"][1 : int(e["padding_mask"].sum()) - 1] for e in packed]
    np.testing.assert_array_equal(np.concatenate(body), stream)
    assert all(e["padding_mask"].all() for e in list(packed)[:-1])
    first = packed[0]["tokens"]
    assert (first[0], first[-1]) == (tok.cls_id, tok.sep_id)
    # Unpacked, "short" and "x" are one mostly padded chunk each.
    assert len(ls.mlm_examples(docs, tok, length=8)) > len(packed)
    batch = next(iter(ls.mlm_dataset(docs, tok, length=8, batch_size=2, pack=True, shuffle=False)))
    assert batch["tokens"].shape == (2, 8) and batch["padding_mask"].all()


def test_mlm_rejects_no_masking_and_no_tokens():
    tok = ls.ByteTokenizer()
    for texts in ([], ["", ""]):
        with pytest.raises(ValueError, match="texts contain no tokens"):
            ls.mlm_examples(texts, tok, length=8)
    with pytest.raises(ValueError, match=r"mask_prob must be in \(0, 1\] .*mask_prob=0"):
        ls.mlm_dataset(DOCS, tok, length=16, batch_size=2, mask_prob=0.0)
    with pytest.raises(ValueError, match=r"mask_prob must be in \(0, 1\]"):
        ls.mask_tokens(
            np.array([9, 10]), np.random.default_rng(0), vocab_size=263, mask_id=6,
            special_ids=range(7), mask_prob=0.0,
        )  # fmt: skip


# ------------------------------------------------------------------------------ loader


def _assert_batches_equal(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys, strict=True):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize("masking", ["dynamic", "fixed"])
def test_iterator_state_resumes_exactly(masking):
    tok = ls.ByteTokenizer()
    ds = ls.mlm_dataset(DOCS * 3, tok, length=12, batch_size=4, masking=masking, seed=1)
    it = iter(ds)
    for _ in range(5):  # crosses an epoch boundary
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # JSON-serialisable
    expected = [next(it) for _ in range(7)]
    resumed = iter(ds)
    resumed.set_state(state)
    _assert_batches_equal([next(resumed) for _ in range(7)], expected)


def test_lm_iterator_state_and_determinism():
    tok = ls.ByteTokenizer()
    ds = ls.lm_dataset(DOCS, tok, length=4, batch_size=2, seed=7)
    a = _epochs(ds, 30)
    _assert_batches_equal(_epochs(ls.lm_dataset(DOCS, tok, length=4, batch_size=2, seed=7), 30), a)
    b = _epochs(ls.lm_dataset(DOCS, tok, length=4, batch_size=2, seed=8), 30)
    assert any((x["inputs"] != y["inputs"]).any() for x, y in zip(a, b, strict=True))
    it = iter(ds)
    next(it)
    state = it.get_state()
    rest = [next(it) for _ in range(10)]
    it.set_state(state)
    _assert_batches_equal([next(it) for _ in range(10)], rest)


def _ids(num, shard, **kw):
    ds = grain.MapDataset.range(num).map(lambda i: np.int64(i))
    out = ls.batch_examples(
        ds, batch_size=1, num_epochs=1, shard_options=shard, drop_remainder=False, **kw
    )
    return [int(b[0]) for b in out]


@pytest.mark.parametrize("drop", [True, False])
def test_sharding_partitions_the_data(drop):
    count, num = 3, 20
    shards = [_ids(num, grain.sharding.ShardOptions(i, count, drop), seed=5) for i in range(count)]
    flat = [x for s in shards for x in s]
    assert len(flat) == len(set(flat))  # disjoint
    if drop:
        assert all(len(s) == num // count for s in shards)  # equal steps on every process
        assert len(flat) == num - num % count
    else:
        assert sorted(flat) == list(range(num))
    # The default shards by JAX process: one process here, so it sees everything.
    assert sorted(_ids(num, None, seed=5)) == list(range(num))
    assert sorted(_ids(num, grain.sharding.ShardByJaxProcess(), shuffle=False)) == list(range(num))
    # Shuffled within the shard, differently for another seed.
    assert _ids(num, None, seed=5) != _ids(num, None, seed=6)


def test_shards_draw_their_own_masks_and_shuffles():
    tok = ls.ByteTokenizer()
    docs = ["abcdefghijklmn"] * 8  # identical examples: only the randomness differs

    def batches(index):
        shard = grain.sharding.ShardOptions(index, 2)
        return _epochs(ls.mlm_dataset(docs, tok, length=16, batch_size=4, shard_options=shard), 3)

    first, second = batches(0), batches(1)
    assert any((a["labels"] != b["labels"]).any() for a, b in zip(first, second, strict=True))
    _assert_batches_equal(batches(0), first)  # each shard is still deterministic
    # Shard 1 holds examples 1, 3, ... next to shard 0's 0, 2, ...: not in the same order.
    ids = [_ids(20, grain.sharding.ShardOptions(i, 2), seed=5) for i in range(2)]
    assert [i - 1 for i in ids[1]] != ids[0]
    assert _ids(20, grain.sharding.ShardOptions(0, 2), seed=5) == ids[0]


def test_loader_bad_inputs():
    ds = grain.MapDataset.range(10)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got batch_size=0"):
        ls.batch_examples(ds, batch_size=0)
    with pytest.raises(ValueError, match="positive integer, got batch_size=-2"):
        ls.batch_examples(ds, batch_size=-2)
    with pytest.raises(ValueError, match="num_epochs must be None or a positive integer"):
        ls.batch_examples(ds, batch_size=2, num_epochs=0)
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0, got num_workers=-1"):
        ls.batch_examples(ds, batch_size=2, num_workers=-1)
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got seed=-1"):
        ls.batch_examples(ds, batch_size=2, seed=-1)


def test_loader_rejects_bools_and_non_datasets():
    ds = grain.MapDataset.range(10)
    with pytest.raises(
        ValueError, match="num_epochs must be None or a positive integer, got num_epochs=True"
    ):
        ls.batch_examples(ds, batch_size=2, num_epochs=True)
    with pytest.raises(
        ValueError, match="num_threads must be an integer >= 0, got num_threads=True"
    ):
        ls.batch_examples(ds, batch_size=2, num_threads=True)
    assert len(list(ls.batch_examples(ds, batch_size=np.int64(5), num_epochs=np.int64(1)))) == 2
    # Without jaxtyping's import hook, whose annotation check would come first.
    with pytest.raises(TypeError, match="examples must be a grain.MapDataset .*got list"):
        inspect.unwrap(ls.batch_examples)([1, 2, 3], batch_size=1)


def test_loader_flags_and_options_are_checked(no_jaxtyping):
    """Truthy strings were read as flags (`shuffle="False"` shuffled), a number as shard
    options crashed in an attribute lookup; all are named now (checks without the hook)."""
    ds = grain.MapDataset.range(10)
    batch = inspect.unwrap(ls.batch_examples)
    for name, value in (("shuffle", "False"), ("drop_remainder", "no")):
        with pytest.raises(TypeError, match=f"{name} must be a bool, got {name}='{value}'"):
            batch(ds, batch_size=2, **{name: value})
    with pytest.raises(TypeError, match="shard_options must be a grain.sharding.ShardOptions.*=2"):
        batch(ds, batch_size=2, shard_options=2)
    with pytest.raises(TypeError, match="random_transform must be callable"):
        batch(ds, batch_size=2, random_transform="mask")
    with pytest.raises(ValueError, match="valid_fraction must be a finite, non-negative.*'a'"):
        inspect.unwrap(ls.text_corpus)(None, valid_fraction="a")
    mask = inspect.unwrap(ls.mask_tokens)
    with pytest.raises(ValueError, match="mask_prob must be a finite, non-negative.*None"):
        mask(np.arange(7, 20), np.random.default_rng(0), vocab_size=263, mask_id=4,
             special_ids=range(7), mask_prob=None)  # fmt: skip


def test_documents_must_be_strings():
    """A grain source of bytes or records was passed through `str()` and trained on as
    "b'...'" / "{'text': ...}"; so was None in a list. In a `grain.MapDataset` None is an
    item its `.filter` dropped (grain's own iteration skips it): left out."""
    tok = ls.ByteTokenizer()
    for docs, got in (([b"hello world"], "bytes"), ([{"text": "a"}], "dict")):
        with pytest.raises(TypeError, match=f"texts must hold strings .* got {got} at texts"):
            ls.lm_windows(grain.MapDataset.source(docs), tok, length=4)
        with pytest.raises(TypeError, match=f"got {got}"):
            ls.mlm_examples(grain.MapDataset.source(docs), tok, length=4)
    with pytest.raises(TypeError, match="texts"):  # (beartype's, or ours at texts[1])
        ls.lm_windows(["hello", None], tok, length=4)
    docs = ["a long enough document", "short", "another long document"]
    kept = grain.MapDataset.source(docs).filter(lambda d: len(d) > 5)
    assert [kept[i] for i in range(3)] == [docs[0], None, docs[2]]
    for make in (ls.lm_windows, ls.mlm_examples):
        got, want = make(kept, tok, length=4), make([docs[0], docs[2]], tok, length=4)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(TypeError, match=r"texts\[0\] \(decode bytes first"):
        ls.lm_windows(grain.MapDataset.source([b"hello world"]), tok, length=4)
    source = grain.MapDataset.source([np.str_("hello world")])  # a str subclass: fine
    assert len(ls.lm_windows(source, tok, length=4)) == 3


def test_a_single_str_is_not_a_corpus():
    texts = [t * 4 for t in DOCS] * 5
    bpe = ls.BPETokenizer.train(texts, vocab_size=300, min_frequency=1)
    calls = (
        lambda: ls.BPETokenizer.train(" ".join(texts), vocab_size=300),
        lambda: ls.ByteTokenizer().encode_batch("abc"),
        lambda: ls.ListOpsTokenizer().encode_batch("[MAX 1 2 ]"),
        lambda: bpe.encode_batch("abc"),
    )
    for call in calls:
        with pytest.raises(TypeError, match="texts must be a sequence of documents, got a single"):
            call()


@pytest.fixture(scope="module")
def tokenizers():
    bpe = ls.BPETokenizer.train(DOCS, vocab_size=270, min_frequency=1)
    return ls.ByteTokenizer(), bpe, ls.ListOpsTokenizer()


@pytest.mark.parametrize(
    "text, got",
    [(b"abc", r"bytes text=b'abc' \(decode bytes first"), (3, "int text=3"),
     (None, "NoneType text=None"), (["abc"], r"list text=\['abc'\]")],
)  # fmt: skip
def test_encode_names_a_text_that_is_not_a_str(tokenizers, text, got, no_jaxtyping):
    """`encode` refuses anything but a `str` by name (it raised AttributeErrors, the Rust
    library's own TypeError, or, for ListOps, encoded bytes); so does `encode_batch`,
    naming the document, and a `texts` that is not a sequence at all."""
    for tok in tokenizers:
        with pytest.raises(TypeError, match=f"text must be a str, got {got}"):
            tok.encode(text)
        with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got"):
            tok.encode_batch(["ok", text])
        with pytest.raises(TypeError, match="texts must be a sequence of documents .*texts=3"):
            tok.encode_batch(3)


def test_encode_names_half_a_surrogate_pair(tokenizers):
    """A `str` holding half a surrogate pair has no UTF-8: `encode` says which character,
    where (BPE raised the Rust library's "TextInputSequence must be str", bytes Python's
    UnicodeEncodeError); whole emoji are text."""
    for tok in tokenizers[:2]:
        assert tok.decode(tok.encode("a\U0001f600b")) == "a\U0001f600b"
    for tok in tokenizers:
        with pytest.raises(ValueError, match=r"text holds '\\ud83d' at index 1, half of a"):
            tok.encode("a\ud83db")
        with pytest.raises(ValueError, match=r"texts\[1\] holds '\\udc00' at index 0"):
            tok.encode_batch(["ok", "\udc00"])


def test_decode_names_the_id_in_its_own_type(tokenizers):
    """Unsigned ids are ids (`Integer`, not `Int`, in the hint); one out of range is
    shown as given, not wrapped through int64 (2**64 - 1 showed as -1)."""
    for tok in tokenizers:
        top = tok.vocab_size - 1
        assert tok.decode(np.array([top], np.uint64)) == tok.decode([top])
        for bad in (2**64 - 1, 2**63 + 5):
            with pytest.raises(ValueError, match=f"vocab_size={tok.vocab_size}\\), got id {bad}$"):
                tok.decode(np.array([7, bad], np.uint64))


def test_bpe_bad_arguments_and_files(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory, expected a file name"):
        ls.BPETokenizer.train(DOCS, vocab_size=270).save(tmp_path / "dir")
    missing = tmp_path / "nodir" / "bpe.json"
    with pytest.raises(FileNotFoundError, match=r"bpe.json'.*directory '.*nodir' does not exist"):
        ls.BPETokenizer.train(DOCS, vocab_size=270).save(missing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]  # no .tmp left behind
    with pytest.raises(
        ValueError, match="min_frequency must be an integer >= 0, got min_frequency=-1"
    ):
        ls.BPETokenizer.train(DOCS, vocab_size=300, min_frequency=-1)
    with pytest.raises(
        ValueError, match="vocab_size must be a positive integer, got vocab_size=True"
    ):
        ls.BPETokenizer.train(DOCS, vocab_size=True)
    for name, text in (("garbage.json", "{not json"), ("list.json", "[1, 2]")):
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=f"{name}' is not a tokenizer saved by BPETokenizer"):
            ls.BPETokenizer.load(tmp_path / name)
    with pytest.raises(ValueError, match="text is not a tokenizer saved by BPETokenizer"):
        ls.BPETokenizer.from_json("[1, 2]")


def test_mask_tokens_checks_its_ids():
    tokens = np.arange(7, 30, dtype=np.int32)
    rng = np.random.default_rng(0)
    kw = dict(vocab_size=263, mask_id=6, special_ids=range(7))
    for bad, message in (
        ({"special_ids": (-1,)}, r"special_ids must be in \[0, vocab_size=263\), got id -1"),
        ({"special_ids": (0, 400)}, r"special_ids must be in \[0, vocab_size=263\), got id 400"),
        ({"mask_id": 999}, r"mask_id must be in \[0, vocab_size=263\), got mask_id=999"),
        ({"mask_id": -1}, "mask_id must be an integer >= 0, got mask_id=-1"),
    ):
        with pytest.raises((ValueError, TypeError), match=message):
            inspect.unwrap(ls.mask_tokens)(tokens, rng, **{**kw, **bad})
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator .*got rng=0"):
        inspect.unwrap(ls.mask_tokens)(tokens, 0, **kw)
    masked, labels = ls.mask_tokens(
        tokens,
        rng,
        vocab_size=np.int64(263),
        mask_id=np.int64(6),
        special_ids=[np.int64(i) for i in range(7)],
        mask_prob=1,
        random_token_prob=0,
    )
    assert (labels == tokens).all() and set(masked.tolist()) <= {6, *tokens.tolist()}


def test_integer_and_real_arguments():
    tok = ls.ByteTokenizer()
    a, b = ls.lm_windows(DOCS, tok, length=np.int64(4)), ls.lm_windows(DOCS, tok, length=4)
    assert len(a) == len(b) and (a[3]["inputs"] == b[3]["inputs"]).all()
    with pytest.raises(ValueError, match="stride must be a positive integer, got stride=True"):
        ls.lm_windows(DOCS, tok, length=4, stride=True)
    ds = ls.mlm_dataset(DOCS, tok, length=16, batch_size=2, mask_prob=1, random_token_prob=0)
    batch = next(iter(ds))
    real = batch["padding_mask"] & (batch["tokens"] != tok.cls_id) & (batch["tokens"] != tok.sep_id)
    assert ((batch["labels"] != ls.IGNORE_INDEX) == real).all()  # mask_prob=1: every token
    assert len(ls.text_corpus(split="all", valid_fraction=0, test_fraction=0)) > 500


def test_bpe_training_documents_must_be_strings(no_jaxtyping):
    """`tokenizers` reads a list of strings as a batch of documents, so training on
    `read_classification`'s records learnt merges of their keys ("text", "label")
    without a word; bytes failed on a bare "'int' object is not an instance of 'str'"
    (as called without jaxtyping's import hook, which samples a list's elements)."""
    records = grain.MapDataset.source([{"text": "hello world", "label": 1}] * 4)
    for texts, got in (
        (records, r"texts\[0\] must be a str, got dict"),
        (["abc def", b"abc"], r"texts\[1\] must be a str, got bytes .*decode bytes first"),
        ((t for t in ["abc", None]), r"texts\[1\] must be a str, got NoneType"),
    ):
        with pytest.raises(TypeError, match=got):
            ls.BPETokenizer.train(texts, vocab_size=270)


def test_in_place_transforms_leave_the_sources_intact():
    """Examples are the pipeline's own: a `random_transform` (or any code) that edits an
    example in place changes neither the window's other array nor later reads."""
    tok = ls.ByteTokenizer()
    windows = ls.lm_windows(DOCS, tok, length=4)
    before = [(w["inputs"].copy(), w["targets"].copy()) for w in windows]

    def dropout(example, rng):  # writes into the example it is given
        example["inputs"][:] = tok.mask_id
        return example

    records = grain.MapDataset.source([{"tokens": np.arange(3), "id": i} for i in range(4)])

    def bump(example, rng):
        assert list(example) == ["tokens", "id"]  # the copy keeps the example's own order
        example["tokens"] += 1
        return example

    for ds, fn in ((windows, dropout), (records, bump)):
        for _ in ls.batch_examples(ds, batch_size=2, num_epochs=2, random_transform=fn):
            pass
    for w, (inputs, targets) in zip(windows, before, strict=True):
        np.testing.assert_array_equal(w["inputs"], inputs)
        np.testing.assert_array_equal(w["targets"], targets)
    assert all((r["tokens"] == np.arange(3)).all() for r in records)
    example = windows[0]
    example["inputs"][:] = 0
    np.testing.assert_array_equal(example["targets"], before[0][1])


def test_bpe_tokenizer_needs_contiguous_ids():
    from tokenizers import Tokenizer, models

    specials = ("<pad>", "<bos>", "<eos>", "<unk>", "<cls>", "<sep>", "<mask>")
    vocab = {t: i for i, t in enumerate(specials)}
    ok = Tokenizer(models.WordLevel({**vocab, "hello": 7}, unk_token="<unk>"))
    assert ls.BPETokenizer(ok).vocab_size == 8
    gap = Tokenizer(models.WordLevel({**vocab, "hello": 1000}, unk_token="<unk>"))
    with pytest.raises(ValueError, match=r"8 tokens must have the ids 0..7, but ids \[7\] are"):
        ls.BPETokenizer(gap)


def test_paths_that_are_not_paths_are_named(no_jaxtyping):
    """pathlib's own error named neither the argument nor its value."""
    bpe = ls.BPETokenizer.train(DOCS, vocab_size=270)
    for call, name, value in (
        (lambda: ls.text_corpus(3), "source", "3"),
        (lambda: ls.BPETokenizer.load(None), "path", "None"),
        (lambda: bpe.save(None), "path", "None"),
    ):
        with pytest.raises(TypeError, match=f"{name} must be a path .*, got {name}={value}"):
            call()
