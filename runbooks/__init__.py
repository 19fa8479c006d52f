"""Packaged data folder (read through importlib.resources)."""
