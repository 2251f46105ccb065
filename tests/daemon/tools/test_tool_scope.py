"""Recall is scoped to the person (or group) a conversation belongs to, and nothing a tool is
given can name a path: another chat's conversation, message, summary or file is "not found",
word for word as one that does not exist, and hostile ids, refs and paths (absolute, `..`,
symlinks, malformed) read nothing outside the state directory and move nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon.app.assembly import assemble
from daemon.core.config import AutomationSettings, Settings
from daemon.core.conversations import SummaryState
from daemon.core.ids import new_id
from daemon.core.messages import Inbound
from daemon.engine.workers import Engine
from daemon.llm.client import ModelClient
from daemon.store import Store
from daemon.store.attachments import StoredFile, store_file
from daemon.store.search_index import SearchIndex
from daemon.tools.builtin import (
    ToolContext,
    conversation_read,
    file_read,
    memory_get,
    memory_search,
)
from daemon.tools.registry import Registry
from daemon.tools.scope import recall_scope
from tests.conftest import RecordingChannel, SettingsFactory
from tests.fakes.ollama import FakeModel, FakeOllama, Reply

ALICE = "telegram:1111111"
BOB = "telegram:2222222"
GROUP = "telegram:-1001234567890"
T0 = time.time() - 3600  # files are stored at the wall clock's time: the messages are near it
SECRET = "Bob's passport number is XK7731904."
FILE_SECRET = "bob-only line: the safe combination is 90-12-44"
NOT_FOUND_CONVERSATION = "ERROR: no conversation {cid!r}; memory_search returns valid references."
NOT_A_FILE = ("ERROR: {path!r} is not a file the user sent; paths look like "
              "attachments/2026-12/<id>.txt, as given in the file's note.")


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"function": {"name": tool, "arguments": arguments}}


@dataclasses.dataclass
class World:
    """Two people and a group in one store, each with a conversation; Bob sent a file."""

    store: Store
    index: SearchIndex
    settings: Settings
    alice: str
    bob: str
    group: str
    bob_file: StoredFile

    def context(self, conversation_id: str, settings: Settings | None = None) -> ToolContext:
        return ToolContext(store=self.store, settings=settings or self.settings,
                           registry=Registry(), conversation_id=conversation_id,
                           clock=time.time, index=self.index)


def all_files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def world(make_settings: SettingsFactory, tmp_path: Path) -> Iterator[World]:
    settings = make_settings()
    store = Store.open(settings.daemon.state_dir)
    index = SearchIndex.open(settings.daemon.state_dir / "memory.sqlite3")
    alice = store.create_conversation(ALICE, T0).id
    store.append_message(alice, "user", "My bike is parked at the station.", created=T0)
    bob = store.create_conversation(BOB, T0 + 1).id
    bob_file = store_file(f"first line\n{FILE_SECRET}\n".encode(),
                          settings.daemon.state_dir / "attachments", name="safe.txt", mime=None)
    store.append_message(bob, "user", SECRET, created=T0 + 1,
                         attachments=(bob_file.to_doc(),))
    store.save_summary(bob, SummaryState(summary=f"Bob said: {SECRET}", through_seq=1,
                                         fold_count=1, folded_at=T0 + 2))
    group = store.create_conversation(GROUP, T0 + 3).id
    store.append_message(group, "user", "The group picnic is on the passport office lawn.",
                         created=T0 + 3)
    yield World(store, index, settings, alice, bob, group, bob_file)
    index.close()
    store.close()


async def test_another_persons_conversation_is_not_found_exactly_like_a_missing_one(
        world: World) -> None:
    ctx = world.context(world.alice)
    missing = new_id(T0)
    for cid in (world.bob, world.group):
        answer = await conversation_read(ctx, cid, 1, 0)
        assert SECRET not in answer
        assert answer == NOT_FOUND_CONVERSATION.format(cid=cid)
        assert (await conversation_read(ctx, missing)).replace(missing, cid) == answer
        got = await memory_get(ctx, f"msg:{cid}:1")
        assert got == f"ERROR: no message #1 in conversation {cid!r}"
        assert (await memory_get(ctx, f"msg:{missing}:1")).replace(missing, cid) == got
        summary = await memory_get(ctx, f"summary:{cid}")
        assert summary == f"ERROR: no conversation {cid!r}"
        assert (await memory_get(ctx, f"summary:{missing}")).replace(missing, cid) == summary
    # Alice's own conversation reads as before.
    own = await conversation_read(ctx, world.alice, 1, 0)
    assert own.endswith("My bike is parked at the station.")
    assert (await memory_get(ctx, f"msg:{world.alice}:1")).endswith("parked at the station.")


async def test_memory_search_finds_only_the_persons_own_messages_and_summaries(
        world: World) -> None:
    alice = await memory_search(world.context(world.alice), "passport number")
    assert "XK7731904" not in alice and world.bob not in alice and world.group not in alice
    assert alice.startswith("Nothing found for 'passport number'")
    bob = await memory_search(world.context(world.bob), "passport number")
    assert "XK7731904" in bob and f"msg:{world.bob}:1" in bob and f"summary:{world.bob}" in bob
    assert world.group not in bob  # Bob is in the group, but the group's words are the group's
    group = await memory_search(world.context(world.group), "passport")
    assert f"msg:{world.group}:1" in group and "XK7731904" not in group


async def test_a_group_and_its_members_private_chats_do_not_see_each_other(world: World) -> None:
    in_group = world.context(world.group)
    assert (await conversation_read(in_group, world.bob)) == NOT_FOUND_CONVERSATION.format(
        cid=world.bob)
    assert (await file_read(in_group, world.bob_file.ref)) == NOT_A_FILE.format(
        path=world.bob_file.ref)
    assert (await conversation_read(world.context(world.bob), world.group)) == (
        NOT_FOUND_CONVERSATION.format(cid=world.group))


async def test_another_persons_file_is_not_found_exactly_like_a_missing_one(
        world: World) -> None:
    ctx = world.context(world.alice)
    ref = world.bob_file.ref
    answer = await file_read(ctx, ref)
    assert FILE_SECRET not in answer and answer == NOT_A_FILE.format(path=ref)
    missing = f"{ref.rsplit('/', 1)[0]}/{new_id()}.txt"
    assert (await file_read(ctx, missing)) == NOT_A_FILE.format(path=missing)
    # Bob reads his own file, also from a later conversation of his chat.
    bob_conversation = world.store.get_conversation(world.bob)
    assert bob_conversation is not None
    world.store.save_conversation(bob_conversation.archived("idle"))
    later = world.store.create_conversation(BOB, time.time()).id
    assert (await file_read(world.context(later), ref)).endswith(f"2: {FILE_SECRET}")


@pytest.mark.parametrize("path", [
    "{outside}/secret.txt",  # absolute, outside the state directory
    "attachments/../../outside/secret.txt",
    "../outside/secret.txt",
    "attachments/{month}/../../../outside/secret.txt",
    "/etc/hostname",
    "attachments/{month}/{id}.txt/",
    "attachments\\..\\..\\outside\\secret.txt",
    "",
])
async def test_file_read_never_reaches_outside_the_attachments(
        world: World, tmp_path: Path, path: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside secret\n", "utf-8")
    month, name = world.bob_file.ref.split("/")[1:]
    path = path.format(outside=outside, month=month, id=name.removesuffix(".txt"))
    # Even a message of Alice's naming that path does not make it readable.
    world.store.append_message(world.alice, "user", "see this", created=T0 + 5,
                               attachments=({"kind": "document", "path": path},))
    answer = await file_read(world.context(world.alice), path)
    assert answer == NOT_A_FILE.format(path=path)


async def test_a_sent_file_replaced_by_a_symlink_out_of_the_attachments_is_not_read(
        world: World, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("outside secret\n", "utf-8")
    stored = world.bob_file.path
    stored.unlink()
    stored.symlink_to(outside)
    ref = world.bob_file.ref
    assert (await file_read(world.context(world.bob), ref)) == NOT_A_FILE.format(path=ref)
    # Named on a message of Alice's as well, the link is still not followed out.
    world.store.append_message(world.alice, "user", "mine", created=T0 + 6,
                               attachments=({"kind": "document", "path": ref},))
    assert (await file_read(world.context(world.alice), ref)) == NOT_A_FILE.format(path=ref)
    assert outside.read_text("utf-8") == "outside secret\n"


def relative_to(path: Path, start: Path) -> str:
    """`path` as a relative path from `start` (with `..`), as a hostile ref would spell it."""
    return os.path.relpath(path, start)


def plant_segment(folder: Path, content: str) -> Path:
    """A segment file in roost's own format, outside the state directory."""
    folder.mkdir(parents=True)
    doc = {"id": new_id(T0), "seq": 1, "role": "user", "content": content, "created": T0}
    path = folder / "seg-000000001.json"
    path.write_text(json.dumps({"messages": {"1": doc}}), "utf-8")
    return path


NOT_A_REF = ("ERROR: {ref!r} is not a reference; use one from memory_search, like "
             "msg:<conversation id>:<seq> or summary:<conversation id>")


def hostile_folders(world: World, folder: Path) -> list[str]:
    """The ways a ref could name `folder`: absolute, relative to the conversations, and
    through a real conversation's folder."""
    relative = relative_to(folder, world.settings.daemon.state_dir / "conversations")
    return [str(folder), relative, f"{world.alice}/../{relative}", f"./{relative}"]


async def test_message_refs_cannot_read_a_segment_planted_outside_the_store(
        world: World, tmp_path: Path) -> None:
    """Issue 17, item 2: `msg:/abs/dir:1` and `msg:../../dir:1` read a planted segment."""
    planted = plant_segment(tmp_path / "planted", "PLANTED outside the state dir")
    before = all_files(tmp_path)
    ctx = world.context(world.alice)
    for where in [*hostile_folders(world, planted.parent), f"{world.alice}/.."]:
        for ref in (f"msg:{where}:1", f"summary:{where}"):
            assert (await memory_get(ctx, ref)) == NOT_A_REF.format(ref=ref)
        assert (await conversation_read(ctx, where, 1, 0)) == (
            NOT_FOUND_CONVERSATION.format(cid=where))
        assert world.store.messages(where) == []
    assert all_files(tmp_path) == before
    assert [m.content for m in world.store.messages(world.bob)] == [SECRET]


async def test_message_refs_cannot_make_roost_rename_a_file_outside_the_store(
        world: World, tmp_path: Path) -> None:
    """Issue 17, item 2: a non-JSON `seg-*.json` outside was moved aside as corrupt."""
    junk = tmp_path / "junk" / "seg-000000001.json"
    junk.parent.mkdir()
    junk.write_bytes(b"not json at all \x00\xff")
    before = all_files(tmp_path)
    ctx = world.context(world.alice)
    answers = {}
    for where in hostile_folders(world, junk.parent):
        answers[where] = (await memory_get(ctx, f"msg:{where}:1"),
                          await conversation_read(ctx, where))
    after = all_files(tmp_path)
    assert not [p for p in after if ".corrupt-" in p.name]
    assert junk.read_bytes() == b"not json at all \x00\xff"
    assert after == before
    assert answers == {where: (NOT_A_REF.format(ref=f"msg:{where}:1"),
                               NOT_FOUND_CONVERSATION.format(cid=where)) for where in answers}


async def test_malformed_refs_are_refused_before_anything_is_looked_up(world: World) -> None:
    ctx = world.context(world.alice)
    cid = world.alice
    for malformed in ("msg:", "msg::1", f"msg:{cid}:", f"msg:{cid}:-1", f"msg:{cid.lower()}:1",
                      f"msg:{cid}:1:2", "summary:", f"file:{cid}", f"msg:{cid}:1.0",
                      f"msg:{cid}:1 2", f"summary:{cid}/", "msg:Z" + cid[1:] + ":1"):
        assert (await memory_get(ctx, malformed)) == NOT_A_REF.format(ref=malformed)
    assert (await memory_get(ctx, f" msg:{cid}:1 ")).endswith("parked at the station.")


def with_automations(settings: Settings, *automations: AutomationSettings) -> Settings:
    return dataclasses.replace(settings, automations=automations)


async def test_an_automation_recalls_its_single_owners_chats_and_not_its_earlier_runs(
        world: World) -> None:
    brief = AutomationSettings(name="brief", schedule="0 7 * * *", prompt="Summarise.",
                               deliver=(BOB, "log"))
    shared = AutomationSettings(name="shared", schedule="0 7 * * *", prompt="Summarise.",
                                deliver=(ALICE, BOB))
    settings = with_automations(world.settings, brief, shared)
    earlier = world.store.create_conversation("automation:brief", T0 + 10).id
    world.store.append_message(earlier, "assistant", "Earlier brief: the passport expires.",
                               created=T0 + 10)
    run = world.store.create_conversation("automation:brief", T0 + 20).id
    ctx = world.context(run, settings)
    found = await memory_search(ctx, "passport")
    assert "XK7731904" in found  # Bob's, who gets every report of this automation
    assert earlier not in found and world.alice not in found
    assert (await conversation_read(ctx, world.alice)) == NOT_FOUND_CONVERSATION.format(
        cid=world.alice)
    assert (await conversation_read(ctx, earlier)) == NOT_FOUND_CONVERSATION.format(cid=earlier)
    assert (await file_read(ctx, world.bob_file.ref)).endswith(f"2: {FILE_SECRET}")
    # Reporting to two people, a run has no owner: it recalls nobody's chats.
    shared_run = world.store.create_conversation("automation:shared", T0 + 30).id
    world.store.append_message(shared_run, "user", "Summarise the passport news.",
                               created=T0 + 30)
    world.index.mark_dirty(shared_run)  # as a turn does after its reply
    alone = world.context(shared_run, settings)
    found = await memory_search(alone, "passport")
    assert "XK7731904" not in found and world.bob not in found
    assert f"msg:{shared_run}:1" in found  # its own conversation, as any conversation
    assert (await conversation_read(alone, world.bob)) == NOT_FOUND_CONVERSATION.format(
        cid=world.bob)
    # An automation no longer configured has no owner either.
    gone = world.store.create_conversation("automation:removed", T0 + 40)
    assert recall_scope(gone, settings.automations).chat_keys == frozenset()


# ---- end to end: two chats, one engine, the fake Ollama scripting the tool calls -----------


@pytest.fixture
async def engine(make_settings: SettingsFactory) -> AsyncIterator[tuple[Engine, FakeOllama]]:
    fake = FakeOllama(models=[FakeModel(context_length=32768,
                                        capabilities=("completion", "tools"))])
    await fake.start()
    settings = make_settings(model={"host": fake.url, "retry_backoff": 0.01})
    store = Store.open(settings.daemon.state_dir)
    llm = ModelClient(settings.model)
    running = assemble(settings, store, llm, {"telegram": RecordingChannel("telegram")}).engine
    await running.start()
    yield running, fake
    await running.stop(grace=0)
    await llm.close()
    store.close()
    await fake.stop()


async def say(engine: Engine, chat: str, text: str,
              attachments: tuple[dict[str, Any], ...] = ()) -> str:
    assert await engine.submit(Inbound(chat_key=chat, text=text, received=time.time(),
                                       attachments=attachments))
    await asyncio.wait_for(engine.wait_idle(chat), 30)
    conversation = engine.store.active_conversation(chat)
    assert conversation is not None
    return conversation.id


async def test_in_a_turn_one_chats_model_cannot_read_another_chats_messages_or_files(
        engine: tuple[Engine, FakeOllama]) -> None:
    running, fake = engine
    sent = store_file(f"header\n{FILE_SECRET}\n".encode(),
                      running.store.state_dir / "attachments", name="safe.txt", mime=None)
    fake.default_reply = lambda body: Reply(content="Noted.")
    bob = await say(running, BOB, SECRET, attachments=(sent.to_doc(),))
    await say(running, ALICE, "Hello, I am Alice.")
    fake.script(
        Reply(tool_calls=[call("memory_search", query="passport number"),
                          call("memory_get", ref=f"msg:{bob}:1"),
                          call("memory_get", ref=f"summary:{bob}"),
                          call("conversation_read", conversation_id=bob),
                          call("tool_activate", name="files")]),
        Reply(tool_calls=[call("file_read", path=sent.ref)]),
        Reply(content="I found nothing of Bob's."))
    alice = await say(running, ALICE, "What is Bob's passport number? Read his file too.")
    results = [(m.tool_name, m.content) for m in running.store.messages(alice)
               if m.role == "tool"]
    assert [name for name, _ in results] == ["memory_search", "memory_get", "memory_get",
                                             "conversation_read", "tool_activate", "file_read"]
    assert results[1][1] == f"ERROR: no message #1 in conversation {bob!r}"
    assert results[2][1] == f"ERROR: no conversation {bob!r}"
    assert results[3][1] == NOT_FOUND_CONVERSATION.format(cid=bob)
    assert results[5][1] == NOT_A_FILE.format(path=sent.ref)
    # Nothing of Bob's reached Alice's model, nor Alice.
    for body in fake.chat_requests:
        if any(m.get("content") == "What is Bob's passport number? Read his file too."
               for m in body["messages"]):
            text = json.dumps(body)
            assert "XK7731904" not in text and "90-12-44" not in text
    telegram = running.channels["telegram"]
    assert isinstance(telegram, RecordingChannel)
    assert all("XK7731904" not in t for t in telegram.texts())
    # Bob's own model still recalls it.
    fake.script(Reply(tool_calls=[call("memory_search", query="passport number")]),
                Reply(content="XK7731904"))
    await say(running, BOB, "What was my passport number?")
    [(_, found)] = [(m.tool_name, m.content) for m in running.store.messages(bob)
                    if m.role == "tool"]
    assert "XK7731904" in found
