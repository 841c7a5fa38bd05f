"""Our own bash kernel: stdout and stderr kept apart, `$?` reported per cell, fast to start.

Run it with ``python -m kernels.bash -f CONNECTION_FILE``; its one command line is
`gateway.sandbox.kernelspec.kernel_argv`.
"""
