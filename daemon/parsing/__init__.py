"""Reading what people send and what web pages hold: PDF, DOCX, XLSX and HTML, each parsed in
a bounded worker process (`pool.py`) so that a hostile file costs an error result, not a turn."""
