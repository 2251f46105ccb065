"""Matrix: a bot account on a homeserver, end-to-end encrypted rooms included (matrix-nio)."""
