"""The client-side commands, built on the typed client (`gateway.client`): `gateway run`
(`run.py`: a notebook or script replayed live over the WebSocket, its files staged by
`staging.py`, its progress drawn by `progress.py`) and `gateway mcp` (`mcp.py`: an MCP
server whose tools run code on a gateway). Like the client, they import nothing of the
server; only the command line (`gateway/cli.py`) meets both."""
