"""Entry point: ``python -m kernels.bash -f CONNECTION_FILE``."""

from __future__ import annotations

import argparse
import logging
import sys

from kernels.bash.kernel import main


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bash", description=__doc__)
    parser.add_argument("-f", dest="connection_file", required=True, help="connection file")
    parser.add_argument("--debug", action="store_true", help="log at debug level")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="[bash kernel] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    return main(args.connection_file)


if __name__ == "__main__":
    sys.exit(run())
