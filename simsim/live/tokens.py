"""How the live server counts tokens, and the filler text it generates.

simsim has no model and no vocabulary, so token counts follow one documented,
deterministic rule (``docs/serve.md``, "Tokens"):

* a prompt given as a list of token ids counts exactly: one token per id;
* text is counted by the **simsim word tokenizer**: every run of letters, digits and
  underscores is one token, and so is every other character that is not white space
  (``"Hello, world!"`` is 4 tokens: ``Hello``, ``,``, ``world``, ``!``);
* a chat prompt is the text ``"<role>: <content>\\n"`` of each message in order, counted
  by the same tokenizer (text parts of a list content are joined with a space).

The generated text is filler: one English word per output token, each preceded by a
space, so the simsim word tokenizer counts exactly the completion's tokens in it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = ["FILLER_WORDS", "chat_text", "count_text_tokens", "filler_text", "filler_token"]

_TOKEN = re.compile(r"\w+|[^\w\s]")

FILLER_WORDS: Final = (
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog",
    "while", "simulated", "tokens", "stream", "at", "the", "decode", "pace",
)  # fmt: skip
"""The words the filler text cycles through; token *n* (from 1) is word ``(n-1) % 17``."""


def count_text_tokens(text: str) -> int:
    """The number of tokens in *text* by the simsim word tokenizer."""
    return sum(1 for _ in _TOKEN.finditer(text))


def filler_token(n: int) -> str:
    """The text of output token *n* (1-based): a space and one filler word."""
    return " " + FILLER_WORDS[(n - 1) % len(FILLER_WORDS)]


def filler_text(count: int) -> str:
    """The text of *count* output tokens, as :func:`filler_token` gives them in turn."""
    return "".join(filler_token(n) for n in range(1, count + 1))


def chat_text(messages: Sequence[tuple[str, str]]) -> str:
    """The text a chat prompt is counted as: ``"<role>: <content>\\n"`` per message."""
    return "".join(f"{role}: {content}\n" for role, content in messages)
