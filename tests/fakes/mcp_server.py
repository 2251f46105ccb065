"""A small MCP server for the tests and the bench, built with the SDK's own server class.

Run as a script it serves stdio (`python tests/fakes/mcp_server.py`), or streamable HTTP on
loopback with `--http PORT` (always 127.0.0.1). Its tools cover what a client must survive:
an echo, a sleep past any timeout, a raise, an image, a process that exits, an embedded
resource, a long text and a schema with `$ref` and a many-typed `anyOf`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import EmbeddedResource, TextResourceContents
from pydantic import BaseModel

# The smallest valid PNG (1x1), so "an image" is a real one.
PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")

# A title in serverInfo and instructions under a Markdown heading, as server-everything ships them.
server = MCPServer(name="fake", title="Fake Test Server",
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
def fail(reason: str = "broken") -> str:
    raise ValueError(f"it failed: {reason}")


@server.tool(description="Return a small PNG image.")
def picture() -> Image:
    return Image(data=PNG_1X1, format="png")


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=0, help="serve streamable HTTP on this port")
    args = parser.parse_args()
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        print("fake MCP server on stdio", file=sys.stderr)
        server.run()


if __name__ == "__main__":
    main()
