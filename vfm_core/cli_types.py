"""argparse value types shared by the ``vfm`` subcommands (kept free of heavy imports)."""

from __future__ import annotations

import argparse
import math


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


def number(name: str, *, above: float | None = None, at_least: float | None = None):
    """An argparse ``type`` for finite floats (``nan`` / ``inf`` refused) > ``above`` or >=
    ``at_least`` whose errors name the flag."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number, got {text!r}")
        if above is not None and value <= above:
            raise argparse.ArgumentTypeError(f"{name} must be > {above:g}, got {text}")
        if at_least is not None and value < at_least:
            raise argparse.ArgumentTypeError(f"{name} must be >= {at_least:g}, got {text}")
        return value

    return parse
