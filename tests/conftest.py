"""Shared pytest configuration; fixtures for real components live in their own plugin modules."""

pytest_plugins = [
    "tests.fakenvml.plugin",
    "tests.slurm.plugin",
    "tests.postgres_server",
    "tests.storage_backends",
    "tests.native_reader",
]
