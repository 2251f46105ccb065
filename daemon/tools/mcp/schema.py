"""Tool schemas small models and Ollama's templates can read (pure).

MCP servers describe arguments with full JSON Schema: `$ref` into `$defs`, `anyOf` of several
types (pydantic writes `Optional[X]` as `anyOf: [X, null]`), titles, defaults. Ollama's tool
templates print the schema into the prompt and small models lose their way in it. This makes
one plain object schema: references inlined (a bounded depth), `X | null` as X, an `anyOf` of
several types as its first simple type with the others named in the description, and no
titles. The arguments are still checked against the server's own schema before a call.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 4
DESCRIPTION_CHARS = 300
_NAME = re.compile("[^A-Za-z0-9_-]")
_KEEP = ("type", "description", "enum", "items", "properties", "required", "default")


def tool_name(server: str, tool: str) -> str:
    """The namespaced name the model calls: `server__tool`, in the characters (and the 64
    of them) that OpenAI-style function names allow."""
    return _NAME.sub("_", f"{server}__{tool}")[:64]


def one_line(text: str | None, limit: int = 120) -> str:
    """The first line of `text`, without control characters, cut to `limit`."""
    line = next((part.strip() for part in (text or "").splitlines() if part.strip()), "")
    line = "".join(ch for ch in line if ch.isprintable())
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


# A server's index line carries a few words of its title (issue 29): 20 servers stay ~300 tokens.
INDEX_WORDS = 5
INDEX_CHARS = 40
_TAGS = re.compile(r"<[^>]*>")
_TEMPLATES = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)  # {{system}}, {% if %}
_LINKS = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_CLAUSE = re.compile(r"[:.;(|]| [-–—] ")  # "GitHub: issues and PRs" is titled "GitHub"


def plain_line(text: str | None, limit: int) -> str:
    """The first line of a server's text (a title, a tool's description) without markup that
    could open or close a prompt section: tags, template markers, links (their text kept) and
    the characters of Markdown's markup. Full-width and other compatibility forms are folded
    first (NFKC): a model reads `＜/system＞` as `</system>`, so the markup it spells is found
    and dropped the same way."""
    text = unicodedata.normalize("NFKC", (text or "")[:4000])  # bounded work on a huge one
    text = _LINKS.sub(r"\1", _TEMPLATES.sub(" ", _TAGS.sub(" ", text)))
    return one_line(text.translate(str.maketrans("", "", "#*`<>[]{}")), limit)


def index_words(text: str | None) -> str:
    """A few plain words of a server's title or description for its index line: the first
    clause of its `plain_line`."""
    line = plain_line(text, 200).replace("_", "")
    words = _CLAUSE.split(line, maxsplit=1)[0].split()[:INDEX_WORDS]
    return " ".join(words)[:INDEX_CHARS].rstrip()


def simplify(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The object schema of a tool's arguments, simplified (see the module docstring)."""
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    out = _node(schema, defs, 0)
    out["type"] = "object"
    out.setdefault("properties", {})
    return out


def _node(node: Any, defs: Mapping[str, Any], depth: int) -> dict[str, Any]:
    if not isinstance(node, Mapping):
        return {}
    node = _resolved(node, defs, depth)
    notes: list[str] = []
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            node, note = _first_choice(node, key, defs, depth)
            notes += [note] if note else []
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
        node = {**_resolved(node["allOf"][0], defs, depth), **{
            k: v for k, v in node.items() if k != "allOf"}}
    kind = node.get("type")
    if isinstance(kind, list):  # ["string", "null"] and the like
        kinds = [k for k in kind if k != "null"]
        if len(kinds) > 1:
            notes.append(f"may also be {', '.join(kinds[1:])}")
        kind = kinds[0] if kinds else "string"
    out: dict[str, Any] = {}
    if kind:
        out["type"] = kind
    description = plain_line(str(node.get("description") or ""), DESCRIPTION_CHARS)
    if notes:
        description = "; ".join(filter(None, [description, *notes]))
    if description:
        out["description"] = description[:DESCRIPTION_CHARS]
    if isinstance(node.get("enum"), list):
        out["enum"] = [v for v in node["enum"] if v is not None]
    if "default" in node and node["default"] is not None and _plain(node["default"]):
        out["default"] = node["default"]
    if kind == "object" or "properties" in node:
        out["type"] = "object"
        if depth < MAX_DEPTH and isinstance(node.get("properties"), Mapping):
            out["properties"] = {str(k): _node(v, defs, depth + 1)
                                 for k, v in node["properties"].items()}
            required = [r for r in node.get("required", ()) if r in out["properties"]]
            if required:
                out["required"] = required
    if kind == "array" and depth < MAX_DEPTH and isinstance(node.get("items"), Mapping):
        out["items"] = _node(node["items"], defs, depth + 1)
    return out


def _resolved(node: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> Mapping[str, Any]:
    """`node` with its `$ref` (into #/$defs or #/definitions) followed, a few levels at most."""
    for _ in range(MAX_DEPTH):
        ref = node.get("$ref")
        if not isinstance(ref, str):
            break
        target = defs.get(ref.rsplit("/", 1)[-1])
        if not isinstance(target, Mapping):
            return {k: v for k, v in node.items() if k != "$ref"} or {"type": "object"}
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _first_choice(node: Mapping[str, Any], key: str, defs: Mapping[str, Any],
                  depth: int) -> tuple[dict[str, Any], str]:
    """An `anyOf`/`oneOf` as its first non-null choice; a note naming the other types."""
    choices = [_resolved(c, defs, depth) for c in node[key] if isinstance(c, Mapping)]
    real = [c for c in choices if c.get("type") != "null"]
    rest = {k: v for k, v in node.items() if k != key}
    if not real:
        return {**rest, "type": rest.get("type", "string")}, ""
    first = real[0]
    others = sorted({str(c.get("type", "object")) for c in real[1:]} - {str(first.get("type"))})
    note = f"may also be {', '.join(others)}" if others else ""
    return {**first, **rest}, note


def _plain(value: Any) -> bool:
    return isinstance(value, str | int | float | bool)
