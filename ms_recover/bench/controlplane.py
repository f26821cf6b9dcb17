"""Placeholder while this benchmark is written."""

from __future__ import annotations

import argparse


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH")


def run(args: argparse.Namespace) -> int:
    print("not written yet")
    return 2
