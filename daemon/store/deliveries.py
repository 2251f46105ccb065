"""What became of a conversation's replies after they were written, where the message itself
cannot say (messages are never rewritten): the voice notes roost sent for them.

`conversations/<id>/deliveries.json`, one TinyDB file per conversation that has any; the console
shows each beside its reply. A file that does not parse is moved aside: it only adds to what
the conversation shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from daemon.store.files import CorruptFile, Files
from daemon.store.segments import MessageLog


class Deliveries:
    def __init__(self, files: Files, log: MessageLog, *, read_only: bool = False) -> None:
        self.files = files
        self.log = log
        self.read_only = read_only

    def path(self, conversation_id: str) -> Path:
        return self.log.folder(conversation_id) / "deliveries.json"

    def add(self, conversation_id: str, doc: Mapping[str, Any]) -> None:
        """Keep `doc` once by its "id" (a send retried after a crash notes it again)."""
        path = self.path(conversation_id)
        try:
            table = self.files.db(path).table("deliveries")
            known = {d.get("id") for d in table.all()}
        except CorruptFile as exc:
            self.files.move_aside(path, str(exc), "starting a new one")
            table, known = self.files.db(path).table("deliveries"), set()
        if doc.get("id") not in known:
            table.insert(dict(doc))

    def of(self, conversation_id: str) -> list[dict[str, Any]]:
        path = self.path(conversation_id)
        if not self.files.exists(path):
            return []
        try:
            return [dict(d) for d in self.files.db(path).table("deliveries").all()]
        except CorruptFile:
            return []  # moved aside by the next write; the conversation is whole without it
