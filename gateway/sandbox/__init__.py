"""Sandboxes: where a kernel runs. One interface (`base`), backends as plug-ins found by
entry point (`local`, `docker`, and any other distribution installs), and `factory` to
make the one named at start."""
