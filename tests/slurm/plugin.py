"""Fixtures: a private single-node Slurm cluster."""
