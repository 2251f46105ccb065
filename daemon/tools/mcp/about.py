"""An MCP server's index line: a few plain words of what it does (pure).

The words come from, in order: the `description` in its config (the user's own); its title
(or the description in its serverInfo); the first line of prose in its instructions; else the
words its tools' names and descriptions use most ("clock: time, timezone, current, convert"),
since most servers send neither a title nor instructions. All but the first are the server's
own, untrusted text: they pass through `plain_line`, which drops whatever could open or close a
prompt section. A configured server that has not listed its tools yet (its first start) has
its config's words, or none: its line is then its name alone.

The line depends only on what the server listed (kept in the catalog), so it keeps its bytes
across turns and restarts; it carries no tool count, so a server with a configured description
keeps it even from before its first listing.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from daemon.tools.mcp.connection import Listing
from daemon.tools.mcp.schema import plain_line
from daemon.tools.ranking import STOP, stem, surface_words, terms, tool_words

if TYPE_CHECKING:  # the SDK is imported at the first server (daemon/tools/mcp/connection.py)
    from mcp import types

INDEX_WORDS = 5  # 20 servers' lines stay about 250 Qwen tokens (issue 29)
INDEX_CHARS = 40
TOOL_INDEX_WORDS = 4
_CLAUSE = re.compile(r"[:.;(|]| [-–—] ")  # "GitHub: issues and PRs" is titled "GitHub"
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
# Words tool descriptions use whatever the tool does (as stems: "needed" is "need").
GENERIC = frozenset(stem(w) for w in """
tool use get return show give specific new multiple optional optionally allow provide base
detail various like helpful perfect useful need want make work one two many every only
""".split())


def index_about(name: str, configured: str | None, listing: Listing | None,
                offered: Sequence[types.Tool] = ()) -> str:
    """The words after `- name: ` in the index (see the module docstring): `listing` is what
    the server listed last (None before it ever did), `offered` the tools of it roost offers."""
    if listing is None:
        return index_words(configured)
    return (index_words(configured) or index_words(listing.description)
            or instruction_words(listing.instructions) or common_words(offered, name))


def index_words(text: str | None) -> str:
    """A few plain words of a title or description: the first clause of its `plain_line`."""
    line = plain_line(text, 200).replace("_", "")
    words = _CLAUSE.split(line, maxsplit=1)[0].split()[:INDEX_WORDS]
    return " ".join(words)[:INDEX_CHARS].rstrip(" ,")


def instruction_words(text: str) -> str:
    """The first clause of the instructions' first line of prose (headings skipped), when it
    is at least two words; else nothing ("Audience:" says nothing about the server)."""
    for line in unicodedata.normalize("NFKC", text[:4000]).splitlines():
        if line.strip().startswith(("#", "---", "===", "```")):
            continue
        words = index_words(line)
        if words:
            return words if len(words.split()) >= 2 else ""
    return ""


def common_words(tools: Sequence[types.Tool], name: str) -> str:
    """The content words the tools use most: in the most tools first, then by weight (in a
    tool's name 3, in its description's first sentence 2, further on 1), then by first use;
    each as it is most often written. Not the server's own name, which the line starts with."""
    own = set(terms(name))
    reach: Counter[str] = Counter()  # stem -> tools using it
    weight: Counter[str] = Counter()
    forms: dict[str, Counter[str]] = {}  # stem -> how it is written
    for tool in tools:
        first, *rest = _SENTENCE.split(tool.description or "", maxsplit=1)
        used: set[str] = set()
        for factor, text in ((3, tool_words(tool.name)), (2, first), (1, " ".join(rest))):
            for word in surface_words(text):
                key = stem(word.lower())
                if (len(word) < 3 or not word.isalpha() or word.lower() in STOP
                        or key in GENERIC or key in own):
                    continue
                used.add(key)
                weight[key] += factor
                forms.setdefault(key, Counter())[word] += 1
        reach.update(used)
    order = sorted(forms, key=lambda k: (-reach[k], -weight[k]))  # stable: first use breaks ties
    chosen: list[str] = []
    for key in order[:TOOL_INDEX_WORDS]:
        word = _written(forms[key])
        if len(", ".join([*chosen, word])) > INDEX_CHARS:
            break
        chosen.append(word)
    return plain_line(", ".join(chosen), INDEX_CHARS)


def _written(forms: Counter[str]) -> str:
    """How a word is shown: its commonest form, lower-cased unless it is a name ("SQLite",
    "URL") rather than a word opening a sentence ("Execute")."""
    lower = Counter({w.lower(): n for w, n in forms.items() if w[1:].islower()})
    return (lower or forms).most_common(1)[0][0]
