"""Execution of one run: sandbox, kernel client, output collection, deadline."""
