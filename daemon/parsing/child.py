"""The worker child: `python -m daemon.parsing.child MEMORY_MB`.

It bounds its own address space, then answers one JSON line per job line on stdin. The jobs
are a fixed table: the parent names one and gives plain arguments. Every job is a boundary: a
hostile file that trips a bug of a parser becomes an error answer, and running out of memory
an answer marked fatal, after which this child exits and the pool starts a fresh one.
"""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Callable
from typing import Any

from daemon.core.errors import DocumentError
from daemon.parsing import html, pdf, sheet, word

JOBS: dict[str, Callable[..., Any]] = {
    "ping": lambda: "pong",
    "pdf_info": pdf.info, "pdf_read": pdf.read, "pdf_search": pdf.search,
    "docx_info": word.info, "docx_read": word.read,
    "xlsx_info": sheet.info, "xlsx_read": sheet.read,
    "html_extract": html.extract,
}

DAMAGED = ("it looks damaged (parts of it are missing or not what they should be); a fresh "
           "copy or an export from the program that made it may read")
OUT_OF_MEMORY = {"error": "it needs more memory than a file of its kind should, so I stopped "
                          "(it may be a zip bomb or otherwise built to exhaust readers)",
                 "fatal": True}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    job = JOBS.get(str(request.get("job")))
    if job is None:
        return {"error": f"no job {request.get('job')!r}"}
    try:
        return {"ok": job(*request.get("args", []))}
    except DocumentError as exc:
        return {"error": str(exc)}
    except MemoryError:
        return OUT_OF_MEMORY
    except RecursionError:
        return {"error": "its structure is nested too deeply to read (damaged or hostile)"}
    except Exception:  # the boundary of one job: a parser's bug on a hostile file
        if _near_the_bound():  # lxml reports a failed allocation as an "unknown" syntax error
            return OUT_OF_MEMORY
        # One plain reason, whatever the library raised: the user cannot act on a class
        # name, and the note and the tools must say the same of the same file.
        return {"error": DAMAGED}


_limit = 0


def _near_the_bound() -> bool:
    """Whether this child's address space came near its bound: then a failure was most likely
    an allocation refused, whatever the library called it. VmPeak, not ru_maxrss: that one
    carries over the parent's peak across exec."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            peak = next((int(line.split()[1]) * 1024 for line in status
                         if line.startswith("VmPeak:")), 0)
    except (OSError, ValueError):
        return False
    return bool(_limit) and peak > _limit * 0.8


def main() -> None:
    global _limit
    limit = _limit = int(sys.argv[1]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print of a library must not corrupt the answers
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
        except ValueError:
            request = {}
        reply = answer(request if isinstance(request, dict) else {})
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()
        if reply.get("fatal"):
            return


if __name__ == "__main__":
    main()
