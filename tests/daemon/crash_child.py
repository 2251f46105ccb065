"""The process test_crash_safety kills: it appends to one conversation until it is SIGKILLed.

    python crash_child.py STATE_DIR CONVERSATION_ID

Prints `ready` once the store is open, then one line per write that returned (acknowledged):

    msg <seq> <id>
    inbox <id>
    outbox <id>

The content of message `seq` is `content_for(seq)`, so the parent can check every message on
disk, acknowledged or not, byte for byte.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from daemon.store import Store


def content_for(seq: int) -> str:
    """Unicode, newlines, quotes; mostly small, every 25th big (so segments also close by size)."""
    line = f'message {seq}: Grüße 🦜 日本語 "quoted" \\ back\n'
    repeat = 2000 if seq % 25 == 0 else 1 + (seq * 7919) % 40
    return line * repeat


def main(state_dir: Path, conversation_id: str) -> None:
    store = Store.open(state_dir)
    conversation = store.get_conversation(conversation_id)
    if conversation is None or store.active_conversation(conversation.chat_key) != conversation:
        raise SystemExit(f"conversation {conversation_id} is not the active one")
    print("ready", flush=True)
    existing = store.messages(conversation_id)
    seq = existing[-1].seq if existing else 0
    pid = os.getpid()
    while True:
        seq += 1
        role = "user" if seq % 2 else "assistant"
        message = store.append_message(conversation_id, role, content_for(seq),
                                       created=time.time())
        if message.seq != seq:
            raise SystemExit(f"expected seq {seq}, the store gave {message.seq}")
        print(f"msg {message.seq} {message.id}", flush=True)
        if seq % 3 == 0:
            item_id = f"in-{pid}-{seq}"
            store.inbox_add({"id": item_id, "chat_key": conversation.chat_key,
                             "received": time.time(), "text": f"inbound {seq} ✉"})
            print(f"inbox {item_id}", flush=True)
        if seq % 4 == 0:
            item_id = f"out-{pid}-{seq}"
            store.outbox_add({"id": item_id, "chat_key": conversation.chat_key,
                              "created": time.time(), "text": f"reply {seq} ✓"})
            print(f"outbox {item_id}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
