"""One turn: prompting, the tool loop, the background folder."""
