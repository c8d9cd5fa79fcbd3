"""Argument types the commands share (argparse calls them; their messages are one line)."""
from __future__ import annotations

import argparse


def positive_rows(text: str) -> int:
    """A count of rows to show (``--limit``, ``--top``): a positive int."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of rows, got {n}")
    return n
