"""argparse value types shared by the ``vfm`` subcommands (kept free of heavy imports)."""

from __future__ import annotations

import argparse


def int_at_least(name: str, minimum: int = 0):
    """An argparse ``type`` for integers >= ``minimum`` whose errors name the flag."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be >= {minimum}, got {value}")
        return value

    return parse
