"""Markdown in the console, rendered to HTML the way a chat showed it, and safe to serve.

The console may not import `channels/` (its formatting renders for chat platforms, not for a
page), so this is the console's own small renderer over the same parser, markdown-it-py:

* Raw HTML is off (`html=False`): a `<script>` or `<img onerror>` anyone wrote is escaped text.
* Every link destination is parsed, then judged here: only http, https and mailto become an
  `<a rel="noopener noreferrer">`; any other (`javascript:`, `data:`, a relative path) keeps
  its words and loses its link, rather than showing raw `[x](...)` as markdown-it would.
* An image written in markdown is never fetched (it could call another site from the page):
  its description becomes a link to it, or plain words when its address is not safe.
* A table sits in a `div.table` whose CSS makes it reflow within a phone's width; code blocks
  wrap (console.css), so nothing pushes the page sideways.
* Single line breaks are kept (`breaks`), as a chat shows them.

`render` and `render_inline` return `Markup`: the only HTML the templates take unescaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from markupsafe import Markup, escape

SAFE_SCHEMES = frozenset({"http", "https", "mailto"})
REL = "noopener noreferrer"
_DROP = "roost_drop"  # meta key: this link's open and close tags are left out


class _Parser(MarkdownIt):
    """CommonMark with GFM tables and strikethrough; raw HTML is text."""

    def __init__(self) -> None:
        super().__init__("commonmark", {"html": False, "linkify": False, "typographer": False,
                                        "breaks": True})
        self.enable(["table", "strikethrough"])
        self.add_render_rule("link_open", _link_open)
        self.add_render_rule("link_close", _link_close)
        self.add_render_rule("image", _image)
        self.add_render_rule("table_open", _table_open)
        self.add_render_rule("table_close", _table_close)

    def validateLink(self, url: str) -> bool:
        # Every destination is parsed as a link, so that a refused one still shows its words
        # (not raw markdown); the scheme is judged when rendering (`safe_href`).
        return True


def safe_href(href: str) -> str | None:
    """The address if it may become a link on the page (http, https, mailto), else None."""
    try:
        scheme = urlsplit(href.strip()).scheme.lower()
    except ValueError:  # e.g. a malformed IPv6 host
        return None
    return href if scheme in SAFE_SCHEMES else None


def _link_open(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict,
               env: EnvType) -> str:
    token = tokens[idx]
    if safe_href(str(token.attrGet("href") or "")) is None:
        token.meta[_DROP] = True
        _matching_close(tokens, idx).meta[_DROP] = True
        return ""
    token.attrSet("rel", REL)
    return self.renderToken(tokens, idx, options, env)


def _link_close(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict,
                env: EnvType) -> str:
    if tokens[idx].meta.get(_DROP):
        return ""
    return self.renderToken(tokens, idx, options, env)


def _matching_close(tokens: Sequence[Token], idx: int) -> Token:
    depth = 0
    for token in tokens[idx:]:
        depth += token.nesting if token.type in ("link_open", "link_close") else 0
        if token.type == "link_close" and depth == 0:
            return token
    raise ValueError("a link_open without its link_close")  # markdown-it always pairs them


def _image(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict,
           env: EnvType) -> str:
    token = tokens[idx]
    words = escape(self.renderInlineAsText(token.children or [], options, env)
                   or "image")
    href = safe_href(str(token.attrGet("src") or ""))
    if href is None:
        return str(words)
    return f'<a href="{escape(href)}" rel="{REL}">{words}</a>'


def _table_open(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict,
                env: EnvType) -> str:
    return '<div class="table">' + self.renderToken(tokens, idx, options, env)


def _table_close(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict,
                 env: EnvType) -> str:
    return self.renderToken(tokens, idx, options, env) + "</div>"


_PARSER = _Parser()


def render(text: str) -> Markup:
    """A message's markdown as block HTML (paragraphs, lists, code, tables)."""
    env: dict[str, Any] = {}
    return Markup(_PARSER.render(text, env))


def render_inline(text: str) -> Markup:
    """One line's markdown (roost's event notes: `**fold**: ...`) without a paragraph."""
    env: dict[str, Any] = {}
    return Markup(_PARSER.renderInline(text, env))
