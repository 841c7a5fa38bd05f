"""R through IRkernel: the launcher, the kernel script and its chart specs."""
