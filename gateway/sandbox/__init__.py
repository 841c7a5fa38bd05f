"""Sandboxes: where a kernel runs. One interface (`base`), two implementations
(`local`, `docker`), and `select` to pick one at start."""
