"""Argument types shared by the command-line experiments."""

import argparse
import math
import pathlib
from collections.abc import Callable

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


def results_dir(checkout: pathlib.Path = _CHECKOUT) -> pathlib.Path:
    """Default `--out` of the experiments whose results the README quotes: the source
    checkout's `benchmarks/results/` (rerunning them there updates the committed files),
    or `benchmarks/results` under the current directory when the package is installed
    without one (a checkout has `pyproject.toml` beside `benchmarks/`)."""
    if (checkout / "benchmarks").is_dir() and (checkout / "pyproject.toml").is_file():
        return checkout / "benchmarks" / "results"
    return pathlib.Path("benchmarks/results")
