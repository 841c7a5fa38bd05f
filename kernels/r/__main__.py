"""Entry point: ``python -P -m kernels.r -f CONNECTION_FILE``: R's kernel (IRkernel with the
gateway's code around it, `kernel.R`), started by replacing this process with R.

R runs with `--vanilla`, so that nothing of the working folder (`.Rprofile`, `.RData`,
`.Renviron`) runs or loads while the kernel starts, as Python kernels start with `-P`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def r_binary() -> str | None:
    return shutil.which("R")


def argv(connection_file: str, r: str) -> list[str]:
    return [r, "--no-echo", "--vanilla", "-f", str(HERE / "kernel.R"), "--args", connection_file]


def run(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.r", description=__doc__)
    parser.add_argument("-f", dest="connection_file", required=True, help="connection file")
    options = parser.parse_args(args)
    r = r_binary()
    if r is None:
        print(
            "kernels.r: R is not installed here (the kernel image's datascience profile has "
            "R and IRkernel; for the local backend, install r-base-core and r-cran-irkernel)",
            file=sys.stderr,
        )
        return 127
    os.environ["GATEWAY_R_KERNEL_DIR"] = str(HERE)
    sys.stdout.flush()
    os.execv(r, argv(options.connection_file, r))  # noqa: S606 (no shell: argv as is)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(run())
