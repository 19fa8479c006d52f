"""Notifiers: Slack, PagerDuty, Alertmanager and the Alertmanager webhook receiver."""
