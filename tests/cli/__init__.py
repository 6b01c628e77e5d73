"""Tests of the polymux command (subprocesses, as a user runs it)."""
