"""The web console: what roost sees, in a browser (sign-in links, conversations whole, each
request against its window)."""
