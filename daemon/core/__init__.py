"""Shared by every layer: settings, the error tree, logs, ids, messages, conversations."""
