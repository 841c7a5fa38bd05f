"""JavaScript and TypeScript: Deno's own Jupyter kernel, reached through `relay.py`."""
