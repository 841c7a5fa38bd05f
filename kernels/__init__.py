"""Kernel-side code: our own kernels and the startup code that runs inside a kernel."""
