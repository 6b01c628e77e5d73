"""Tests of examples/chat and examples/filetransfer (subprocesses, as a user runs them)."""
