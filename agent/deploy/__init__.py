"""Packaged deployment templates (systemd unit, commented agent config)."""
