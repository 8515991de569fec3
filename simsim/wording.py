"""Counts in words, for what simsim prints: one rule for singular and plural.

Every message, report line, figure label and ``repr`` that puts a count before a noun
writes it with :func:`counted`, so that ``1 replica`` and ``2 replicas`` read right
everywhere. It imports nothing of simsim, so any layer may use it.
"""

from __future__ import annotations

__all__ = ["counted"]


def counted(number: int, noun: str, plural: str | None = None, *, grouped: bool = False) -> str:
    """*number* and *noun*, the noun in the plural unless *number* is 1.

    ``counted(1, "replica")`` is ``"1 replica"``, ``counted(3, "replica")`` is
    ``"3 replicas"``, ``counted(0, "request")`` is ``"0 requests"``. The plural adds an
    ``s`` to the last word, or is *plural* when that is wrong (``counted(2, "class",
    "classes")``). With *grouped*, the number has thousands separators
    (``counted(60_000, "request", grouped=True)`` is ``"60,000 requests"``).
    """
    shown = f"{number:,}" if grouped else f"{number}"
    if number == 1:
        return f"{shown} {noun}"
    return f"{shown} {plural if plural is not None else noun + 's'}"
