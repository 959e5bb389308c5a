"""Text corpora as grain `MapDataset`s of documents, with a deterministic split."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import re
import sysconfig
from collections.abc import Sequence

import grain

from .._checks import RealLike, check_path
from ._loader import check_split

_SUFFIXES = (".txt", ".py", ".jsonl")
# A JSON string may escape half of a surrogate pair ("\\ud83d", e.g. an emoji cut in two),
# which no UTF-8 encoder (so no tokenizer) accepts.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def split_of(document_id: str, *, valid_fraction: RealLike, test_fraction: RealLike) -> str:
    """Which split a document belongs to: a stable hash of its id mapped to [0, 1).

    `[0, valid)` is `"valid"`, `[valid, valid + test)` is `"test"`, the rest `"train"`.
    Independent of the machine, the Python hash seed, and of every other document.
    """
    data = document_id.encode("utf-8", errors="surrogatepass")  # a JSONL id may hold one
    digest = hashlib.blake2b(data, digest_size=8).digest()
    u = int.from_bytes(digest, "little") / 2**64
    if u < valid_fraction:
        return "valid"
    if u < valid_fraction + test_fraction:
        return "test"
    return "train"


def _stdlib_files() -> tuple[pathlib.Path, list[pathlib.Path]]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = [
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.relative_to(root).parts and p.is_file()
    ]
    return root, files


def _corpus_files(root: pathlib.Path, excluded: frozenset[str] = frozenset()) -> list[pathlib.Path]:
    """The corpus files under `root`: hidden files and folders (`.git`, `.venv`, ...)
    skipped, and those in or under `excluded` (real paths); symbolic links to folders outside
    the tree followed (each folder once), while a link to a folder of the tree (or to an
    ancestor) is not, and a link to a file is read only if no other path reaches that
    file, so a document's id is its path through real folders whatever links exist."""

    def visible(names):
        return sorted(n for n in names if not n.startswith("."))

    tree = set()  # the real folders, reached without links
    for folder, subfolders, _ in os.walk(root):
        subfolders[:] = visible(subfolders)
        tree.add(os.path.realpath(folder))
    top = os.path.realpath(root)
    # A folder holding the whole corpus (e.g. an --out above --corpus) excludes nothing.
    excluded = frozenset(e for e in excluded if not _within(top, frozenset({e})))
    files, seen = [], set()
    for folder, subfolders, names in os.walk(root, followlinks=True):
        seen.add(os.path.realpath(folder))
        kept = []
        for name in visible(subfolders):
            path = os.path.join(folder, name)
            real = os.path.realpath(path)
            inside = real in tree or top.startswith(real + os.sep)
            if not ((os.path.islink(path) and inside) or real in seen or _within(real, excluded)):
                seen.add(real)
                kept.append(name)
        subfolders[:] = kept
        for name in names:
            path = pathlib.Path(folder, name)
            if not name.startswith(".") and _suffix(path) in _SUFFIXES and path.is_file():
                if not _within(os.path.realpath(path), excluded):
                    files.append(path)
    # A file is read once: a link to a file that is read anyway (or that an earlier link
    # reaches) would duplicate a document under another id, maybe in another split.
    direct = {os.path.realpath(p) for p in files if not p.is_symlink()}
    kept = []
    for path in sorted(files):
        real = os.path.realpath(path)
        if path.is_symlink():
            if real in direct:
                continue
            direct.add(real)
        kept.append(path)
    return kept


def _within(real: str, folders: frozenset[str]) -> bool:
    """Whether the real path `real` is one of `folders` (real paths) or inside one."""
    return any(real == f or real.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def _suffix(path: pathlib.Path) -> str:
    """`path`'s suffix in lower case (`A.TXT` is a text file)."""
    return path.suffix.lower()


# The id of a JSONL line without one: this prefix and a hash of its text.
_UNNAMED = "text#"


def _read_documents(path: pathlib.Path, root: pathlib.Path, text_field: str):
    rel = path.relative_to(root).as_posix() if path != root else path.name
    if _suffix(path) == ".jsonl":
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(record, dict):
                    kind = type(record).__name__
                    raise ValueError(f"{path}:{lineno}: not a JSON object (got {kind})")
                if text_field not in record:
                    raise ValueError(f"{path}:{lineno}: JSON object has no {text_field!r} field")
                text = record[text_field]
                if not isinstance(text, str):
                    raise ValueError(
                        f"{path}:{lineno}: field {text_field!r} must be a string, got {text!r}"
                    )
                text = LONE_SURROGATE.sub("\ufffd", text)
                if "id" not in record:
                    # Named by its text, not its line number: inserting or removing a line
                    # moves no other line between splits, and a repeated line (one
                    # document, in any file) cannot be in two.
                    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()
                    yield _UNNAMED + digest, text, f"{path}:{lineno}"
                    continue
                doc_id = record["id"]
                if isinstance(doc_id, bool) or not isinstance(doc_id, str | int):
                    raise ValueError(
                        f"{path}:{lineno}: field 'id' must be a string or an integer, "
                        f"got {doc_id!r}"
                    )
                yield str(doc_id), text, f"{path}:{lineno}"
    else:
        yield rel, path.read_text(encoding="utf-8-sig", errors="replace"), str(path)


def read_documents(
    source: str | os.PathLike | None = None,
    *,
    text_field: str = "text",
    exclude: Sequence[str | os.PathLike] = (),
) -> list[tuple[str, str]]:
    """All `(document_id, text)` pairs of a source, sorted by id, empty documents dropped.

    See [`lineax_seq.text_corpus`][] for what `source` and `exclude` may be.
    """
    excluded = _excluded(exclude)
    if source is None:
        return list(_stdlib_documents())
    return _read_documents_uncached(source, text_field, excluded)


def _excluded(exclude: object) -> frozenset[str]:
    """The real paths of `exclude`, a sequence of paths (a lone path is refused: a string
    is a sequence of characters)."""
    if isinstance(exclude, str | os.PathLike) or not isinstance(exclude, Sequence):
        raise TypeError(
            f"exclude must be a sequence of paths (str or os.PathLike), got exclude={exclude!r}"
        )
    for path in exclude:
        check_path("exclude", path)
        if not os.fspath(path):  # pathlib reads "" as ".", the working directory
            raise ValueError("exclude holds '', which is not a path")
    return frozenset(os.path.realpath(path) for path in exclude)


@functools.cache
def _stdlib_documents() -> tuple[tuple[str, str], ...]:
    # The installed standard library does not change while the process runs.
    return tuple(_read_documents_uncached(None, "text", frozenset()))


def _read_documents_uncached(source, text_field, excluded):
    if source is None:
        root, files = _stdlib_files()
        if not files:
            raise ValueError(f"source=None: found no .py files under the stdlib path {root}")
    else:
        check_path("source", source)
        if not os.fspath(source):  # pathlib reads "" as ".", the working directory
            raise ValueError(
                "source='' is not a path: give a file or directory (\".\" for the working "
                "directory), or None for the stdlib corpus"
            )
        root = pathlib.Path(source)
        if not root.exists():
            raise FileNotFoundError(f"source {str(source)!r} does not exist")
        if not (root.is_file() or root.is_dir()):
            raise ValueError(f"source {str(source)!r} is neither a regular file nor a directory")
        if root.is_file():
            if _suffix(root) not in _SUFFIXES:
                raise ValueError(
                    f"source {str(source)!r} has suffix {root.suffix!r}; "
                    f"allowed are {', '.join(_SUFFIXES)}"
                )
            files = [root]
        else:
            files = _corpus_files(root, excluded)
            if not files:
                raise ValueError(
                    f"source {str(source)!r} is a directory with no {'/'.join(_SUFFIXES)} files"
                )
    docs, seen = {}, {}
    for path in sorted(files):
        for doc_id, text, where in _read_documents(path, root, text_field):
            if doc_id in seen:
                if doc_id.startswith(_UNNAMED):
                    continue  # a repeated line without an id: the same document
                raise ValueError(
                    f"{where}: duplicate document id {doc_id!r} (first at {seen[doc_id]})"
                )
            seen[doc_id] = where
            if text.strip():
                docs[doc_id] = text
    if not docs:
        raise ValueError(f"source {str(source)!r} contains only empty documents")
    return sorted(docs.items())


def _is_text_file(source) -> bool:
    """Whether `source` is a single `.txt` / `.py` file (one long text)."""
    if source is None:
        return False
    path = pathlib.Path(source)
    return path.is_file() and _suffix(path) in (".txt", ".py")


def _contiguous_split(
    text: str, split: str, valid_fraction: RealLike, test_fraction: RealLike
) -> str:
    """The `split` part of one long text: train, then valid, then test, in that order,
    of `1 - valid - test`, `valid` and `test` of its characters, each cut moved to the
    nearest line start, or left mid-line where that would empty a part."""
    n = len(text)

    def at(fraction) -> int:
        return min(n, max(0, round(n * float(fraction))))

    def line_start(pos: int) -> int:
        before = text.rfind("\n", 0, pos) + 1
        after = text.find("\n", max(pos - 1, 0))
        after = n if after < 0 else after + 1
        best = before if pos - before <= after - pos else after
        return best if 0 < best < n else pos

    raw = (at(1 - float(valid_fraction) - float(test_fraction)), at(1 - float(test_fraction)))
    a, b = (p if p in (0, n) else line_start(p) for p in raw)
    if not a <= b or (a == b) != (raw[0] == raw[1]):  # a snap emptied or crossed a part
        a, b = raw
    return {"train": text[:a], "valid": text[a:b], "test": text[b:]}[split]


def text_corpus(
    source: str | os.PathLike | None = None,
    *,
    split: str = "train",
    valid_fraction: RealLike = 0.05,
    test_fraction: RealLike = 0.05,
    text_field: str = "text",
    exclude: Sequence[str | os.PathLike] = (),
) -> grain.MapDataset:
    """A text corpus as a grain `MapDataset` of documents (strings).

    The default corpus needs no download: the Python standard library's own `.py`
    sources (found through `sysconfig`; about 1,800 files, 30 MB of real code), one
    document per file. A user `source` may be a `.txt`/`.py` file (one document), a
    `.jsonl` file (one document per line, its `text_field`, a string; an `"id"` field,
    a string or an integer, if present, names the document, else a hash of its text
    does, so repeated lines without ids, in any of the files, are one document), or a
    directory searched
    recursively for such files (following symbolic links to folders, and reading a file
    that links reach by several paths once; hidden files and folders, such as `.git` or
    `.venv`, are skipped; suffixes match in any case, `A.TXT` too). Files are read as
    UTF-8 (line ends read as `\\n`; a byte-order mark at the start is skipped); invalid
    bytes, and JSON escapes of half a surrogate pair, become the replacement character
    U+FFFD rather than an error.

    Documents go to `"train"`, `"valid"` or `"test"` by a stable hash of their id (the
    path relative to `source`; for JSONL lines as above), so the split never depends on
    the machine, the order of files or lines, or on which other documents exist. Ids are
    relative to `source`, so give the same `source` for training and evaluation: a
    subfolder names its documents differently and splits them differently. A single
    `.txt`/`.py` file (e.g. a book) is instead split by position, as is usual for
    one-file corpora: its first `1 - valid_fraction - test_fraction` of characters
    train, the next `valid_fraction` validate, the last `test_fraction` test (each cut
    at the nearest line start), one document per split.

    **Arguments:**

    - `source`: `None` (the stdlib corpus) or a file or directory path.
    - `split`: `"train"`, `"valid"`, `"test"`, or `"all"`.
    - `valid_fraction`, `test_fraction`: expected fractions of documents in the
        validation and test splits (of characters, for a single text file).
    - `text_field`: the JSONL field holding the text.
    - `exclude`: files and folders under a directory `source` not to read (a folder with
        everything in it), matched by real path; e.g. a run's output folder inside the
        corpus folder. Paths that do not exist, and folders that hold `source` itself,
        are ignored.

    **Returns:**

    A `grain.MapDataset` of `str`, sorted by document id.

    **Raises:**

    `FileNotFoundError` for a missing path; `ValueError` for an empty source, an
    unknown `split`, bad fractions, a split with no documents, or a JSONL line that is
    not an object with a string `text_field` (naming the file and line), and for two
    documents with the same id.
    """
    check_split(split, valid_fraction, test_fraction)
    docs = read_documents(source, text_field=text_field, exclude=exclude)
    if split != "all" and _is_text_file(source):
        text = docs[0][1]
        piece = _contiguous_split(text, split, valid_fraction, test_fraction)
        if not piece.strip():
            raise ValueError(
                f"split={split!r} of source {str(source)!r} has no documents (a single text "
                f"file is split by position, and this one's {len(text)} characters leave "
                f"that part empty; use a longer file, larger fractions, or split='all')"
            )
        docs = [(docs[0][0], piece)]
    elif split != "all":
        docs = [
            d
            for d in docs
            if split_of(d[0], valid_fraction=valid_fraction, test_fraction=test_fraction) == split
        ]
        if not docs:
            raise ValueError(
                f"split={split!r} of source {str(source)!r} has no documents (split by a hash "
                "of document ids; use more documents, larger fractions, or split='all')"
            )
    return grain.MapDataset.source([text for _, text in docs])
