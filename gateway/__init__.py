"""A code-execution gateway: every request runs in a fresh Jupyter kernel in its own sandbox."""

from gateway.version import __version__

__all__ = ["__version__"]
