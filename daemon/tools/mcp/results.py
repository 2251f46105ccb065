"""An MCP tool result as the text the model gets (pure).

Text stays text; an embedded text resource becomes its text under its URI; binary parts (an
image, audio, a blob) become a one-line note of what they were, so nothing undecodable enters a
conversation; a server's error becomes an error line. The whole is capped at the configured
size with a note of how much was left out: the model never gets more than the cap, and the turn
shows it even less of a large one (daemon.turn.tool_loop), stubbing it on later turns like any
tool result. The text is the server's, so untrusted: it goes in a tool message between roost's
untrusted-content label (as web pages and documents do), never in the system message.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING

from daemon.tools.registry import ToolOutput
from daemon.tools.untrusted import labelled

if TYPE_CHECKING:
    from mcp import types

ERROR_PREFIX = "ERROR: "


MAX_IMAGES = 2  # images of one result passed on for a model that can see


def result_output(result: types.CallToolResult, cap: int, source: str) -> ToolOutput:
    """The text, labelled untrusted and from `source`, and the images (decoded, at most
    MAX_IMAGES) for a model that can see."""
    from mcp import types  # not at the top: see daemon/tools/mcp/connection.py

    images: list[bytes] = []
    for part in result.content:
        if (isinstance(part, types.ImageContent) and len(images) < MAX_IMAGES
                and part.mime_type.startswith("image/")):
            try:
                images.append(base64.b64decode(part.data, validate=True))
            except (binascii.Error, ValueError):
                continue
    return ToolOutput(result_text(result, cap, source), tuple(images))


def result_text(result: types.CallToolResult, cap: int, source: str) -> str:
    """The server's words between roost's untrusted-content label (daemon.tools.untrusted);
    an error result says so before the label."""
    parts = [_part(p) for p in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False)]
    text = "\n".join(p for p in parts if p) or "(the tool returned nothing)"
    left_out = ""
    if len(text) > cap:
        text, left_out = text[:cap], f"[{len(text) - cap:,} more characters of it were left out]"
    what = "error report" if result.is_error else "tool result"
    text = labelled(what, source, text, left_out)
    return f"{ERROR_PREFIX}the tool reported an error:\n{text}" if result.is_error else text


def _part(part: object) -> str:
    from mcp import types  # not at the top: see daemon/tools/mcp/connection.py

    if isinstance(part, types.TextContent):
        return part.text
    if isinstance(part, types.ImageContent | types.AudioContent):
        kind = "image" if isinstance(part, types.ImageContent) else "audio"
        return f"[{kind}: {part.mime_type}, {_size(part.data)} bytes]"
    if isinstance(part, types.EmbeddedResource):
        resource = part.resource
        if isinstance(resource, types.TextResourceContents):
            return f"[resource {resource.uri}]\n{resource.text}"
        if isinstance(resource, types.BlobResourceContents):
            return (f"[resource {resource.uri}: {resource.mime_type or 'binary'}, "
                    f"{_size(resource.blob)} bytes; not shown here]")
    if isinstance(part, types.ResourceLink):
        return f"[link {part.name}: {part.uri}]"
    return f"[a {type(part).__name__} part; not shown here]"


def _size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return len(data)
