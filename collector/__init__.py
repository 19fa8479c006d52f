"""The gpuwarden central collector."""
