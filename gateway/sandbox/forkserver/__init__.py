"""The forkserver backend: kernels forked from a warm parent (backend.py)."""
