"""`python -m gateway ...` is the `gateway` console script."""

from gateway.cli import main

raise SystemExit(main())
