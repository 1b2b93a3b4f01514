"""Utilities every layer may use: errors, hashing, files, git, locks, paths, the import graph."""
