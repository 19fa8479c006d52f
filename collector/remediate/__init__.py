"""Remediation: the policy that decides, the actuators that act, the audit that remembers."""
