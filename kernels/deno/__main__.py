"""Entry point: ``python -P -m kernels.deno -f CONNECTION_FILE`` (an ipc connection file)."""

from __future__ import annotations

import argparse
import sys

from kernels.deno.relay import main


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.deno", description=__doc__)
    parser.add_argument("-f", dest="connection_file", required=True, help="connection file")
    args = parser.parse_args(argv)
    return main(args.connection_file)


if __name__ == "__main__":
    sys.exit(run())
