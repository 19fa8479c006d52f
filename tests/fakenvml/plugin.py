"""Fixtures: the fake NVML library (see fake_nvml.c)."""
