"""Command line: `gateway serve [flags]` starts the server, `gateway run FILE` runs a
notebook or a script on a running one (see `--help`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from gateway import mcp_server, runcli
from gateway import settings as settings_module
from gateway.startup import configure_logging, load_settings
from gateway.version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gateway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the gateway")
    settings_module.add_arguments(serve)
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    runcli.add_parser(commands)
    mcp = commands.add_parser(
        "mcp", help="serve the run_code tool over MCP", conflict_handler="resolve"
    )
    settings_module.add_arguments(mcp)  # for the gateway it starts without --url
    mcp_server.add_arguments(mcp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return runcli.main(args)
    if args.command == "mcp":
        return mcp_server.main(args)
    if args.command == "serve":
        configure_logging(str(args.log_level), logging.INFO)
        settings = load_settings(args, "gateway")
        if settings is None:
            return 2
        from gateway.server import serve

        try:
            asyncio.run(serve(settings))
        except (RuntimeError, OSError) as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 1
        return 0
    return 2
