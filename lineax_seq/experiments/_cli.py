"""Argument types shared by the command-line experiments."""

import argparse
import math
from collections.abc import Callable


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


def positive_float(text: str) -> float:
    """An `argparse` type: a finite number > 0."""
    return _number(text, float, lambda v: 0 < v < math.inf, "a positive finite number")


def fraction(text: str) -> float:
    """An `argparse` type: a number in `[0, 1]`."""
    return _number(text, float, lambda v: 0 <= v <= 1, "a number in [0, 1]")
