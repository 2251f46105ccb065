"""Scheduled work: automations (`scheduler`, `runner`, `schedule`) and reminders (`reminders`),
with their records (`state`) and commands (`commands`)."""
