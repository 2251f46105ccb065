"""The built-in `web` capability: the address guard, the fetch, the search backends and the
tools (`tools.register`)."""
