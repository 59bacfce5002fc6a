"""The package's commands: ``co2`` (``--version``) and ``co2-aggregator``,
the shard bundled with the wheel (docs/operations.md has its flags)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from . import _core
from ._local import find_aggregator


def aggregator() -> None:
    """Runs the co2-aggregator that ``co2.find_aggregator()`` finds, with
    this command's arguments; it replaces this process, so signals and the
    exit status are the shard's own."""
    binary = find_aggregator()
    if os.path.realpath(binary) == os.path.realpath(sys.argv[0]):
        # The PATH found this command itself: the package has no binary.
        sys.exit("co2-aggregator: this co2 package holds no co2-aggregator binary "
                 "(set CO2_AGGREGATOR to one)")
    os.execv(binary, [binary, *sys.argv[1:]])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``co2 --version``: the package's version and wire protocol;
    ``co2 aggregator-path``: the co2-aggregator the package runs."""
    parser = argparse.ArgumentParser(
        prog="co2", description="co2: data-parallel training across slow links (docs/python.md)")
    parser.add_argument("--version", action="version",
                        version=f"co2 {_core.__version__} (wire protocol {_core.protocol_version()})")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("aggregator-path", help="print the co2-aggregator binary the package runs")
    args = parser.parse_args(argv)
    if args.command == "aggregator-path":
        print(find_aggregator())
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
