"""GPU sources behind one protocol: NVML, a simulated fleet, and replay of recorded traces."""
