"""Argument types shared by the command-line experiments."""

import argparse


def positive_int(text: str) -> int:
    """An `argparse` type: an integer > 0."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def positive_float(text: str) -> float:
    """An `argparse` type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive finite number")
    return value


def fraction(text: str) -> float:
    """An `argparse` type: a number in `[0, 1]`."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in [0, 1]")
    return value
