"""A small MCP server for the tests and the bench, built with the SDK's own server class.

Run as a script it serves stdio (`python tests/fakes/mcp_server.py`), or streamable HTTP on
loopback with `--http PORT` (always 127.0.0.1); `--delay SECONDS` waits before serving, as a
real server does while its SDK imports or `npx` fetches it. Its tools cover what a client must
survive: an echo, a sleep past any timeout, a raise, an image, a process that exits, an
embedded resource, a long text, a schema with `$ref` and a many-typed `anyOf`, and a tool that
must be run as a task (`execution.taskSupport = "required"`, as server-everything's
`simulate-research-query`), which the SDK's server class cannot declare, so `list_tools` adds it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import time
import zlib
from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import EmbeddedResource, TextResourceContents, Tool, ToolExecution
from pydantic import BaseModel

# The smallest valid PNG (1x1), so "an image" is a real one.
PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")

TASK_ONLY = "research"


class FakeServer(MCPServer):
    async def list_tools(self) -> list[Tool]:
        return [t.model_copy(update={"execution": ToolExecution(task_support="required")})
                if t.name == TASK_ONLY else t for t in await super().list_tools()]


def _chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + body) if crc is None else crc
    return len(body).to_bytes(4, "big") + kind + body + crc.to_bytes(4, "big")


# The 1x1 PNG with a colour profile whose checksum is wrong, as in the iCCP chunk of the
# reference server's `get-tiny-image` (server-everything): browsers and Telegram show it.
PNG_BAD_ICCP = (PNG_1X1[:33]
                + _chunk(b"iCCP", b"ICC Profile\x00\x00" + zlib.compress(b"not a profile"), 0)
                + PNG_1X1[33:])
# A PNG whose pixel data is not there: nobody can show it.
PNG_BROKEN = PNG_1X1[:33] + _chunk(b"IDAT", b"garbage") + _chunk(b"IEND", b"")


# A title in serverInfo and instructions under a Markdown heading, as server-everything ships them.
server = FakeServer(name="fake", title="Fake Test Server",
                    instructions="# Fake Server – Server Instructions\n\n"
                                 "Test tools: echo, sleep, fail, image and more.\n"
                                 "Second line of instructions.")


class Address(BaseModel):
    street: str
    city: str


@server.tool(description="Echo the text back.")
def echo(text: str) -> str:
    return f"echo: {text}"


@server.tool(description="Sleep for a number of seconds, then answer.")
async def sleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "slept"


@server.tool(description="Always raises an error.")
def fail(reason: str = "broken", said: bool = False) -> str:
    if said:  # the SDK's server sends a ToolError's words, as mcp-server-fetch's refusals are
        raise ToolError(f"Refused: {reason}")
    raise ValueError(f"it failed: {reason}")  # these it hides: "Error executing tool fail"


@server.tool(description="Return a small PNG image.")
def picture(kind: Literal["fine", "bad_profile_checksum", "broken"] = "fine") -> Image:
    data = {"fine": PNG_1X1, "bad_profile_checksum": PNG_BAD_ICCP, "broken": PNG_BROKEN}[kind]
    return Image(data=data, format="png")


@server.tool(description="Make the server process exit at once.")
def crash() -> str:
    os._exit(3)


@server.tool(description="Return an embedded text resource.")
def resource() -> EmbeddedResource:
    return EmbeddedResource(type="resource", resource=TextResourceContents(
        uri="file:///notes.txt", mime_type="text/plain", text="the resource's text"))


@server.tool(description="The names of the environment variables the server was given.")
def environment() -> str:
    return " ".join(sorted(os.environ))


@server.tool(description="Return a long text of n characters.")
def long_text(n: int) -> str:
    return "x" * n


@server.tool(description="Store an address; mode is one of a few kinds.")
def address(where: Address, mode: Literal["home", "work"] | int | None = None) -> str:
    return f"{where.street}, {where.city} ({mode})"


@server.tool(name=TASK_ONLY, description="Research a question, as a long-running task.")
def research(question: str) -> str:
    # A server that requires tasks refuses a plain call (server-everything does likewise).
    raise ValueError("this tool must be called as a task (task-augmented execution)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=0, help="serve streamable HTTP on this port")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before serving")
    args = parser.parse_args()
    time.sleep(args.delay)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        print("fake MCP server on stdio", file=sys.stderr)
        server.run()


if __name__ == "__main__":
    main()
