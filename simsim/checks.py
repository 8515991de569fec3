"""Argument checks with one message each: counts, the 64-bit limit, real numbers, names.

The bottom floor of simsim: it imports nothing of simsim, so every layer may use it, and
a message that several modules write is written here once:

* :func:`check_int` and :func:`check_positive_int`: a whole number (``operator.index``
  accepted, so NumPy integers are; ``bool`` refused) at least some minimum and at most
  ``2**63 - 1``;
* :func:`overflow`: ``"<name> = <value> is past the 64-bit limit 2**63 - 1"``, the one
  wording of every ``OverflowError`` about a computed value;
* :func:`check_real`: a finite real number ``>= 0`` (a weight, an aging rate, a target);
* :func:`check_choice` and :func:`did_you_mean`: a name among known ones, with a guess
  at what a misspelt one meant.
"""

from __future__ import annotations

import difflib
import math
import numbers
import operator
from collections.abc import Iterable

__all__ = [
    "INT64_MAX",
    "check_choice",
    "check_int",
    "check_positive_int",
    "check_real",
    "check_weight",
    "closest",
    "did_you_mean",
    "overflow",
]

INT64_MAX = 2**63 - 1
"""The largest value simsim represents: signed 64-bit, as the timestamps are."""


def overflow(name: str, value: object, unit: str = "") -> OverflowError:
    """The error for *value*, named *name*, past ``2**63 - 1``; the caller raises it.

    ``overflow("prefill_us(5, 1)", total, " us")`` reads ``prefill_us(5, 1) = <total> us
    is past the 64-bit limit 2**63 - 1``. Hot paths compare against :data:`INT64_MAX`
    themselves and call this only to write the message.
    """
    return OverflowError(f"{name} = {value}{unit} is past the 64-bit limit 2**63 - 1")


def check_int(value: object, name: str, *, minimum: int = 0) -> int:
    """*value* as a plain ``int`` from *minimum* to ``2**63 - 1``, or raise naming *name*.

    For counts, ids and sizes: ``bool`` and non-integers raise ``TypeError`` (NumPy
    integers and other ``operator.index`` types are converted), values below *minimum*
    ``ValueError``, values past ``2**63 - 1`` ``OverflowError``.
    """
    if type(value) is not int:
        if isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got bool {value!r}")
        try:
            value = int(operator.index(value))  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"{name} must be an int, got {type(value).__name__} {value!r}"
            ) from None
    assert isinstance(value, int)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > INT64_MAX:
        raise overflow(name, value)
    return value


def check_positive_int(value: object, name: str) -> int:
    """*value* as a plain ``int`` from 1 to ``2**63 - 1`` (see :func:`check_int`)."""
    return check_int(value, name, minimum=1)


def check_real(
    value: object, name: str, *, unit: str = "", keep_int: bool = False, positive: bool = False
) -> float:
    """*value* as a finite real number ``>= 0``, or raise naming *name*.

    ``bool`` and non-numbers raise ``TypeError`` (``"<name> must be a number<unit>"``);
    NaN, infinities and negatives raise ``ValueError`` (``"<name> must be a finite
    number >= 0<unit>"``, or ``> 0`` with *positive*: a rate, a mean). *unit*
    (``" microseconds"``) follows the rule in both. The
    result is a ``float``, or with *keep_int* an ``int`` when *value* is an integer (an
    order key stays exact).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        of = f" of{unit}" if unit else ""
        raise TypeError(f"{name} must be a number{of}, got {type(value).__name__} {value!r}")
    number: float
    if keep_int and hasattr(type(value), "__index__"):
        number = int(operator.index(value))  # type: ignore[arg-type]
    else:
        number = float(value)
    if not ((number > 0 if positive else number >= 0) and math.isfinite(number)):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}{unit}, got {value!r}")
    return number


def check_weight(value: object, name: str) -> float:
    """*value* as a token weight: a finite ``float`` ``>= 0`` (see :func:`check_real`)."""
    return check_real(value, name)


def closest(name: object, choices: Iterable[str]) -> str | None:
    """The one of *choices* closest to *name* if any is close (a likely misspelling),
    else ``None``: the guess behind every did-you-mean."""
    if not isinstance(name, str):
        return None
    close = difflib.get_close_matches(name, list(choices), n=1)
    return close[0] if close else None


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """``" (did you mean 'fcfs'?)"`` when one of *choices* is close to *name*, else ``""``."""
    guess = closest(name, choices)
    return f" (did you mean {guess!r}?)" if guess is not None else ""


def check_choice(value: object, what: str, choices: Iterable[str], *, known: str = "") -> str:
    """*value* if it is one of *choices*, else ``ValueError`` with a guess.

    The message reads ``unknown <what> 'fcfss' (did you mean 'fcfs'?); known <known>:
    edf, fair, fcfs`` (*known* defaults to ``<what>s``). A non-``str`` raises
    ``TypeError``.
    """
    names = list(choices)
    if not isinstance(value, str):
        raise TypeError(f"a {what} name must be a str, got {type(value).__name__} {value!r}")
    if value not in names:
        raise ValueError(
            f"unknown {what} {value!r}{did_you_mean(value, names)}; "
            f"known {known or what + 's'}: {', '.join(sorted(names))}"
        )
    return value
