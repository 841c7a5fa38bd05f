"""Runs: what a client asks for (`RunRequest`), what it gets back (`RunRecord`), and the
service that schedules, records and cancels them."""
