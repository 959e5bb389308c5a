"""Argument types shared by the command-line experiments."""

import argparse
import contextlib
import math
import os
import pathlib
from collections.abc import Callable, Iterator

_CHECKOUT = pathlib.Path(__file__).parents[2]


def _number(text: str, convert: Callable[[str], float], ok: Callable[[float], bool], what: str):
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


def existing_path(text: str) -> pathlib.Path:
    """An `argparse` type: a file or directory that exists."""
    path = pathlib.Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    return path


@contextlib.contextmanager
def corpus_errors(corpus: str | os.PathLike | None) -> Iterator[None]:
    """Turn a corpus that cannot serve the run (too few documents for a held-out split,
    documents shorter than a window...) into a one-line error naming `--corpus`, not a
    traceback."""
    try:
        yield
    except ValueError as e:
        where = "the stdlib corpus" if corpus is None else f"--corpus {str(corpus)!r}"
        hint = ""
        if "has no documents" in str(e):
            hint = (
                ". With a directory, documents go to the held-out split by a hash of their "
                "paths (about 5%): give more files, or one long text file (split by position)"
            )
        elif "longest document" in str(e):
            hint = ". Use shorter sequence lengths (see --help) or longer documents"
        raise SystemExit(f"error: {where}: {e}{hint}") from None


def results_dir(checkout: pathlib.Path = _CHECKOUT) -> pathlib.Path:
    """Default `--out` of the experiments whose results the README quotes: the source
    checkout's `benchmarks/results/` (rerunning them there updates the committed files),
    or `benchmarks/results` under the current directory when the package is installed
    without one (a checkout has `pyproject.toml` beside `benchmarks/`)."""
    if (checkout / "benchmarks").is_dir() and (checkout / "pyproject.toml").is_file():
        return checkout / "benchmarks" / "results"
    return pathlib.Path("benchmarks/results")
