"""Everything a message passes before a worker sees it: durable intake, the gate, pairing."""
