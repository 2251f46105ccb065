"""`roost models` on a real model: SmolLM2-135M on llama.cpp behind the Ollama-wire server.

Its template has no tools and no thinking, its GGUF says its own context length, the server
refuses an over-window prompt told not to cut, and roost's token estimate (the turn's, with
SmolLM2's small vocabulary) lands near the real tokenizer's count on the mixed text.
"""

from __future__ import annotations

import io
import json

from daemon.cli.models import run_models
from daemon.models import load_card
from tests.conftest import SettingsFactory
from tests.llama.server import VERSION, ServerThread

MODEL = "smollm2:135m"


async def test_the_card_of_a_real_small_model(real_ollama: ServerThread,
                                              make_settings: SettingsFactory) -> None:
    settings = make_settings(model={"host": real_ollama.url, "window": 1024})
    out, err = io.StringIO(), io.StringIO()
    status = await run_models(settings, [MODEL], as_json=True, out=out, err=err)
    assert status == 0, err.getvalue()
    (card,) = json.loads(out.getvalue())
    assert real_ollama.server is not None
    assert card["context"] == real_ollama.server.context_length  # what /api/show says: 8192
    assert card["num_ctx"] == 1024
    assert card["tools"] == "none" and card["thinking"] == "none"
    assert card["truncate"] == "refuses"
    assert abs(card["estimate_error"]) < 0.15, card["estimate_error"]
    assert card["tokens_per_s"] > 0 and 0 < card["cached_share"] < 1
    assert card["vision"] is None and card["memory"] > 0
    stored = load_card(settings.daemon.state_dir, MODEL, VERSION)
    assert stored is not None and stored.to_json() == card
