"""Admission policies by name: the built-in schedulers and the registry scenarios use.

Every scheduler here has :class:`~simsim.FcfsScheduler`'s epoch, statistics and
stale-decision rules, and every order ends in ``(arrival_time_us, request_id)``, so runs
stay deterministic. ``docs/schedulers.md`` gives each one's exact order.

``SCHEDULERS`` maps a policy name (a scenario's ``[scheduler] policy``) to a factory
taking the policy's options as keyword arguments; :func:`make_scheduler` builds one with
clear errors for an unknown name or option.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any

from simsim.scheduler import FcfsScheduler, Scheduler
from simsim.schedulers.base import HeapScheduler
from simsim.schedulers.edf import EarliestDeadlineFirstScheduler
from simsim.schedulers.fair import FairShareScheduler
from simsim.schedulers.priority import PriorityScheduler
from simsim.schedulers.sjf import (
    ShortestJobFirstScheduler,
    ShortestPromptFirstScheduler,
    SizeOrderedScheduler,
)

__all__ = [
    "SCHEDULERS",
    "EarliestDeadlineFirstScheduler",
    "FairShareScheduler",
    "FcfsScheduler",
    "HeapScheduler",
    "PriorityScheduler",
    "ShortestJobFirstScheduler",
    "ShortestPromptFirstScheduler",
    "SizeOrderedScheduler",
    "make_scheduler",
]

SCHEDULERS: dict[str, Callable[..., Scheduler]] = {
    "fcfs": FcfsScheduler,
    "priority": PriorityScheduler,
    "shortest_prompt": ShortestPromptFirstScheduler,
    "shortest_job": ShortestJobFirstScheduler,
    "edf": EarliestDeadlineFirstScheduler,
    "fair": FairShareScheduler,
}
"""Policy name -> factory (called with the policy's options as keyword arguments)."""


def make_scheduler(name: str, **options: Any) -> Scheduler:
    """A new scheduler of policy *name* (a key of :data:`SCHEDULERS`) built with *options*.

    An unknown name raises ``ValueError`` listing the known ones; an option the policy
    does not take raises ``TypeError`` listing those it takes; a bad option value raises
    the policy's own ``TypeError`` or ``ValueError``.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"a scheduler policy name must be a str, got {type(name).__name__} {name!r}"
        )
    factory = SCHEDULERS.get(name)
    if factory is None:
        close = difflib.get_close_matches(name, SCHEDULERS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown scheduler policy {name!r}{hint}; "
            f"known policies: {', '.join(sorted(SCHEDULERS))}"
        )
    accepted = _option_names(factory)
    if accepted is not None:
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            takes = f"its options are {', '.join(accepted)}" if accepted else "it takes no options"
            raise TypeError(
                f"scheduler policy {name!r} has no option {', '.join(map(repr, unknown))}; {takes}"
            )
    return factory(**options)


def _option_names(factory: Callable[..., Scheduler]) -> list[str] | None:
    """The keyword options *factory* takes, or ``None`` when it takes any (``**kwargs``)
    or its signature cannot be read."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    names = []
    for parameter in parameters:
        if parameter.kind is parameter.VAR_KEYWORD:
            return None
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            names.append(parameter.name)
    return names
