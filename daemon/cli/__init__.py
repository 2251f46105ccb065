"""The `roost` command."""
