"""Telegram: verify, parse, admit, translate, send."""
