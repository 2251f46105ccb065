"""MCP servers as capabilities: each configured server is one capability of the registry."""
