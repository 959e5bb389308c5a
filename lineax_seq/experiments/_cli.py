"""Argument types shared by the command-line experiments."""

import argparse
import contextlib
import hashlib
import json
import math
import os
import pathlib
import re
import tempfile
from collections.abc import Callable, Iterator
from typing import TypeVar

_CHECKOUT = pathlib.Path(__file__).parents[2]

_Number = TypeVar("_Number", int, float)


def _number(
    text: str, convert: Callable[[str], _Number], ok: Callable[[_Number], bool], what: str
) -> _Number:
    """`convert(text)` if it parses and passes `ok`, else an `ArgumentTypeError`."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_int(text: str) -> int:
    """An `argparse` type: an integer > 0."""
    return _number(text, int, lambda v: v > 0, "a positive integer")


def int_at_least(minimum: int, why: str = "") -> Callable[[str], int]:
    """An `argparse` type: an integer >= `minimum` (`why`: the reason, for the message)."""
    what = f"an integer >= {minimum}{f' ({why})' if why else ''}"

    def convert(text: str) -> int:
        return _number(text, int, lambda v: v >= minimum, what)

    convert.__name__ = f"int_at_least_{minimum}"
    return convert


def non_negative_int(text: str) -> int:
    """An `argparse` type: an integer >= 0."""
    return _number(text, int, lambda v: v >= 0, "a non-negative integer")


def positive_float(text: str) -> float:
    """An `argparse` type: a finite number > 0."""
    return _number(text, float, lambda v: 0 < v < math.inf, "a positive finite number")


def finite_float(text: str) -> float:
    """An `argparse` type: a finite number."""
    return _number(text, float, math.isfinite, "a finite number")


def non_negative_float(text: str) -> float:
    """An `argparse` type: a finite number >= 0."""
    return _number(text, float, lambda v: 0 <= v < math.inf, "a non-negative finite number")


def fraction(text: str) -> float:
    """An `argparse` type: a number in `[0, 1]`."""
    return _number(text, float, lambda v: 0 <= v <= 1, "a number in [0, 1]")


def dropout_rate(text: str) -> float:
    """An `argparse` type: a number in `[0, 1)`."""
    return _number(text, float, lambda v: 0 <= v < 1, "a dropout rate in [0, 1)")


def positive_fraction(text: str) -> float:
    """An `argparse` type: a number in `(0, 1]`."""
    return _number(text, float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def random_seed(text: str) -> int:
    """An `argparse` type: a seed, an integer in `[0, 2**32)` (a PRNG key holds 32 bits of
    it: larger seeds would repeat smaller ones)."""
    return _number(text, int, lambda v: 0 <= v < 2**32, "a seed (an integer in [0, 2**32))")


def path(text: str) -> pathlib.Path:
    """An `argparse` type: a path, not `''` (which `pathlib` reads as the current
    directory)."""
    if not text:
        raise argparse.ArgumentTypeError("'' is not a path")
    return pathlib.Path(text)


def existing_path(text: str) -> pathlib.Path:
    """An `argparse` type: a file or directory that exists (not `''`)."""
    found = path(text)
    if not found.exists():
        glob = " (wildcards are not expanded: give a directory)" if "*" in text else ""
        raise argparse.ArgumentTypeError(f"{text!r} does not exist{glob}")
    return found


class HelpFormatter(argparse.HelpFormatter):
    """`--help` with every option's default: appended as `(default: X)` unless the help
    text already speaks of its default, or there is none to show (a flag, `None`)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS))
            or "default" in text
        ):
            return text
        return f"{text} (default: %(default)s)"


class UsageError(ValueError):
    """A user's input (an option's value, a file, a checkpoint) that the run cannot use,
    found before training: `python -m lineax_seq` reports it as a usage error (exit
    status 2, one line under the command's usage), not a traceback."""


@contextlib.contextmanager
def reading_inputs(what: str = "") -> Iterator[None]:
    """Delimit a phase that only reads the user's inputs (files, checkpoints, options the
    library checks): a `ValueError`, `TypeError` or `OSError` raised there is the input's
    fault, re-raised as a `UsageError` prefixed with `what` (e.g. `"--train data.csv"`).

    Never put training or evaluation inside: an error there is a bug and keeps its
    traceback.
    """
    try:
        yield
    except UsageError:
        raise
    except (ValueError, TypeError, OSError) as e:
        message = str(e)
        if isinstance(e, UnicodeDecodeError):
            message = f"not UTF-8 text ({e})"
        raise UsageError(f"{what}: {message}" if what else message) from e


# The library's advice that names its keyword arguments, not command-line options.
_API_ADVICE = re.compile(r"; use [^;()]*split='all'\)")


@contextlib.contextmanager
def corpus_errors(corpus: str | os.PathLike | None) -> Iterator[None]:
    """Turn a corpus that cannot serve the run (too few documents for a held-out split,
    documents shorter than a window, too few sequences for a batch...) into a
    `UsageError` naming `--corpus`, with advice in terms of the command-line options."""
    try:
        yield
    except (ValueError, OSError) as e:
        where = "the stdlib corpus" if corpus is None else f"--corpus {str(corpus)!r}"
        message = _API_ADVICE.sub(")", str(e))
        hint = ""
        if "has no documents" in message and corpus is not None and _is_jsonl(corpus):
            hint = (
                ". JSONL lines go to the held-out split by a hash of their ids, or texts "
                "(about 5%): give more lines"
            )
        elif "has no documents" in message and corpus is not None and pathlib.Path(corpus).is_dir():
            hint = (
                ". With a directory, documents go to the held-out split by a hash of their "
                "paths (about 5%): give more files, or one long text file (split by position)"
            )
        elif "longest document" in message:
            hint = ". Use shorter sequence lengths (see --help) or longer documents"
        elif "examples available" in message:
            hint = ". Use a smaller --batch-size or --length, or a larger corpus"
        raise UsageError(f"{where}: {message}{hint}") from e


def _is_jsonl(corpus: str | os.PathLike) -> bool:
    path = pathlib.Path(corpus)
    return path.is_file() and path.suffix.lower() == ".jsonl"


def output_problem(flag: str, path: pathlib.Path, *, directory: bool = True) -> str | None:
    """Why `path` (a directory to write into, or a file when not `directory`) cannot be
    written, checked before any training: an existing file where a directory goes (or a
    directory where a file goes), or a file or a directory that refuses new entries
    above it."""
    path = pathlib.Path(path)
    if directory and path.exists() and not path.is_dir():
        return f"{flag} {path}: exists and is not a directory"
    if not directory and path.is_dir():
        return f"{flag} {path}: is a directory (expected a file name, e.g. {path / 'out.png'})"
    parent = path if directory else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{flag} {path}: {parent} is a file, not a directory"
    try:  # a probe, not `os.access`: root passes that on read-only or virtual mounts
        os.rmdir(tempfile.mkdtemp(prefix=".lineax_seq_probe_", dir=parent))
    except OSError as e:
        return f"{flag} {path}: cannot write in {parent} ({e.strerror})"
    return None


def settings_tag(settings: dict) -> str:
    """A short, stable name for `settings` (six hex digits of a hash of their JSON), for
    output file names that must not collide with another run's."""
    text = json.dumps(sorted(settings.items()), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:6]


def results_dir(checkout: pathlib.Path = _CHECKOUT) -> pathlib.Path:
    """Default `--out` of the experiments whose results the README quotes: the source
    checkout's `benchmarks/results/` (rerunning them there updates the committed files),
    or `benchmarks/results` under the current directory when the package is installed
    without one (a checkout has `pyproject.toml` beside `benchmarks/`)."""
    if (checkout / "benchmarks").is_dir() and (checkout / "pyproject.toml").is_file():
        return checkout / "benchmarks" / "results"
    return pathlib.Path("benchmarks/results")


def matched_width(count: Callable[[int], int], base: int, target: int, *, multiple: int = 1) -> int:
    """The width `w`, a multiple of `multiple` away from `base`, whose parameter count
    `count(w)` is closest to `target`: the count is affine in the width (an MLP's or an
    inner layer's), so it is measured at two widths and solved for."""
    at_base = count(base)
    slope = (count(base + multiple) - at_base) / multiple
    return base + multiple * round((target - at_base) / slope / multiple)
