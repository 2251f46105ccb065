"""Issue 43 against the real model: a conversation at a 2,048-token window where roost's
estimate tracks the server's count, nothing is claimed cut, nothing shown is taken back, no
turn ends as too large while the server refused nothing, and turn one's facts are in every
request. (The 26-turn figures: `python bench/real_model.py`.)"""

from __future__ import annotations

from pathlib import Path

from tests.llama.conversation import converse
from tests.llama.server import ServerThread

TURNS = 7  # the tier is a few conversations, not a benchmark


async def test_a_conversation_at_a_2k_window_is_fitted_as_the_model_counts(
    real_ollama: ServerThread, tmp_path: Path,
) -> None:
    figures = await converse(real_ollama, TURNS, tmp_path / "state")
    assert figures.refused == 0
    assert figures.claimed_cuts == 0 and figures.taken_back == 0 and figures.too_large == 0
    assert figures.errors, "no chat request after the first was counted"
    assert figures.worst() <= 0.10, figures.errors
    assert figures.median() <= 0.05, figures.errors
    assert figures.without_facts == 0
