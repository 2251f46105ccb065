"""A real Matrix homeserver (Synapse) on loopback for the Matrix channel's tests."""
