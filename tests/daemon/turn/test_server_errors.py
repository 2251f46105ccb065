"""Ollama answering 500: a server that keeps failing is an outage (the user told once, the
message answered once it works again); a 500 that names the request itself is reported."""

from __future__ import annotations

from tests.conftest import RecordingChannel, SettingsFactory
from tests.daemon.turn.test_turn import (  # noqa: F401  (engine_for is a fixture)
    CHAT,
    engine_for,
    fast,
    say,
)
from tests.fakes.ollama import FakeOllama, Reply

RUNNER_DIED = "llama runner process has terminated: exit status 2"


async def test_a_persistent_500_is_an_outage_and_the_message_is_answered_when_it_ends(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for,  # noqa: F811
    recording_channel: RecordingChannel,
) -> None:
    # Three tries of the first turn and one of its next try fail; then Ollama works again.
    fake_ollama.script(*[Reply(status=500, error=RUNNER_DIED)] * 4)
    engine = await engine_for(fast(make_settings, fake_ollama))
    await say(engine, "are you there?")
    assert recording_channel.texts("reply") == ["echo: are you there?"]
    [notice] = recording_channel.texts("notice")
    assert "saved" in notice and "answer" in notice
    assert RUNNER_DIED not in notice and "500" not in notice
    assert len(fake_ollama.chat_requests) == 5
    conversation = engine.store.active_conversation(CHAT)
    assert conversation is not None
    assert [m.content for m in engine.store.messages(conversation.id)] == [
        "are you there?", "echo: are you there?"]


async def test_a_500_that_names_the_request_is_reported_not_held(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for,  # noqa: F811
    recording_channel: RecordingChannel,
) -> None:
    # What Ollama's ChatHandler answers when the model's template cannot render this request.
    fake_ollama.script(Reply(status=500, error=(
        'template: :14:11: executing "" at <.Messages>: error calling slice: index out of '
        "range")))
    engine = await engine_for(fast(make_settings, fake_ollama))
    await say(engine, "first")
    assert recording_channel.texts("reply") == []
    [notice] = recording_channel.texts("notice")
    assert "error" in notice and "saved" in notice
    assert len(fake_ollama.chat_requests) == 1  # not the model server's fault: not retried
    await say(engine, "second")
    assert recording_channel.texts("reply") == ["echo: second"]


async def test_a_persistent_500_with_one_attempt_configured_is_an_outage_too(
    fake_ollama: FakeOllama, make_settings: SettingsFactory, engine_for,  # noqa: F811
    recording_channel: RecordingChannel,
) -> None:
    # The quiet second try after a 500 is not one of `retry_attempts` (tries while Ollama is
    # out): with 1 configured, a runner that keeps failing is still held and answered later.
    fake_ollama.script(*[Reply(status=500, error=RUNNER_DIED)] * 3)
    engine = await engine_for(fast(make_settings, fake_ollama, retry_attempts=1))
    await say(engine, "are you there?")
    assert recording_channel.texts("reply") == ["echo: are you there?"]
    [notice] = recording_channel.texts("notice")
    assert "saved" in notice and "answer" in notice and "inside roost" not in notice
