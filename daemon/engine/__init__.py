"""Per-chat workers, delivery, the router and chat commands."""
