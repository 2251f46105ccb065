"""An answer too large to take, for the fakes of servers roost reads from: megabytes streamed
64 KiB at a time, recording how much got out before the client hung up. A real server gone
wrong (a speech engine looping, a search proxy answering a file) does the same; a client that
reads with a cap hangs up early, one that reads whole takes it all."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

CHUNK = 64 * 1024


@dataclass
class Flood:
    """One oversized answer: what was meant to go out and what did before the client left."""

    size: int
    declared: bool = False  # sent with its Content-Length (else chunked, size unknown up front)
    content_type: str = "application/octet-stream"
    sent: int = 0
    cut: bool = False  # the client closed the connection before the end
    done: bool = False

    async def send(self, request: web.Request) -> web.StreamResponse:
        """Stream the flood as the answer to `request` (its body read first)."""
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": self.content_type})
        if self.declared:
            response.content_length = self.size
        chunk = b"\0" * CHUNK
        try:
            await response.prepare(request)
            while self.sent < self.size:
                part = chunk[:self.size - self.sent]
                await response.write(part)
                self.sent += len(part)
            await response.write_eof()
        except ConnectionError:
            self.cut = True  # the client hung up: this is what it did not take
        except asyncio.CancelledError:
            self.cut = True
            raise
        finally:
            self.done = True
        return response
