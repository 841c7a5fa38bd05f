"""Command line: `gateway serve [flags]` starts the server, `gateway run FILE` runs a
notebook or a script on a running one, `gateway mcp` serves the run_code tool over MCP (see
`--help`).

The top of the layers: the client side (`gateway.client`) and the server
(`gateway.server`) meet only here, and the server is imported only by the commands that
start one."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Sequence

from gateway.commands import mcp
from gateway.commands import run as run_command
from gateway.configure import add_settings_flags, configure_logging, load_settings
from gateway.extras import missing
from gateway.version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gateway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the gateway")
    add_settings_flags(serve)
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    run_command.add_parser(commands)
    mcp_parser = commands.add_parser(
        "mcp", help="serve the run_code tool over MCP", conflict_handler="resolve"
    )
    add_settings_flags(mcp_parser)  # for the gateway it starts without --url
    mcp.add_arguments(mcp_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return run_command.main(args)
    if args.command == "mcp":
        return serve_mcp(args)
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


def serve_mcp(args: argparse.Namespace) -> int:
    """`gateway mcp`: the MCP server, on the gateway at `--url` or on one of its own."""
    configure_logging(str(args.log_level), logging.WARNING)  # to stderr: stdout is MCP's
    absent = missing("mcp")
    if absent is not None:
        print(f"gateway mcp: {absent}.", file=sys.stderr)
        return 2
    settings = load_settings(args, "gateway mcp")
    if settings is None:
        return 2
    data_dir = settings.data_dir if getattr(args, "data_dir", None) else None

    @contextlib.asynccontextmanager
    async def start_gateway() -> AsyncIterator[tuple[str, str]]:
        from gateway.server import private_gateway

        async with private_gateway(settings, "mcp", data_dir) as (url, token):
            yield url, token

    return mcp.main(args, start_gateway)
