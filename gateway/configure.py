"""What every long-running command does first: configure logging to stderr and build the
settings, explaining a bad configuration in one line instead of a traceback.

With `gateway.server`, the composition root: the commands see the settings only through
these functions, and the server hands each part its own config."""

from __future__ import annotations

import argparse
import logging
import sys

from gateway import settings as settings_module


def configure_logging(level: str, default: int) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper(), default),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting (`--max-timeout`), and `--config FILE`."""
    settings_module.add_arguments(parser)


def load_settings(args: argparse.Namespace, prog: str) -> settings_module.Settings | None:
    """The settings from flags, environment and config file; None (said on stderr) if bad."""
    try:
        return settings_module.load(args)
    except (OSError, ValueError) as exc:
        print(f"{prog}: bad configuration: {exc}", file=sys.stderr)
        return None
