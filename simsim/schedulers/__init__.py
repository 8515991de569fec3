"""Admission policies by name: the built-in schedulers and the registry scenarios use.

Every scheduler here has :class:`~simsim.FcfsScheduler`'s epoch, statistics and
stale-decision rules, and every order ends in ``(arrival_time_us, request_id)``, so runs
stay deterministic. ``docs/schedulers.md`` gives each one's exact order.

``SCHEDULERS`` maps a policy name (a scenario's ``[scheduler] policy``) to a factory
taking the policy's options as keyword arguments; :func:`make_scheduler` builds one with
clear errors for an unknown name or option.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simsim.registry import Registry
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
    "register_scheduler",
]

SCHEDULERS: Registry[Callable[..., Scheduler]] = Registry("scheduler policy", "policies")
"""Policy name -> factory (called with the policy's options as keyword arguments), in
the order the docs list them; :func:`register_scheduler` adds a user's own."""

for _name, _factory in (
    ("fcfs", FcfsScheduler),
    ("priority", PriorityScheduler),
    ("shortest_prompt", ShortestPromptFirstScheduler),
    ("shortest_job", ShortestJobFirstScheduler),
    ("edf", EarliestDeadlineFirstScheduler),
    ("fair", FairShareScheduler),
):
    SCHEDULERS.register(_name, _factory)


def register_scheduler(
    name: str, factory: Callable[..., Scheduler], *, replace: bool = False
) -> Callable[..., Scheduler]:
    """Make *factory* the scheduler policy *name*, for scenario files and
    :func:`make_scheduler`; returns *factory*.

    *factory* (a class or a function) is called with the policy's options as keyword
    arguments, which its signature declares: a scenario's ``[scheduler]`` table may set
    exactly those. A name already taken raises ``ValueError`` unless *replace* is true.
    """
    return SCHEDULERS.register(name, factory, replace=replace)


def make_scheduler(name: str, **options: Any) -> Scheduler:
    """A new scheduler of policy *name* (a key of :data:`SCHEDULERS`) built with *options*.

    An unknown name raises ``ValueError`` listing the known ones; an option the policy
    does not take raises ``TypeError`` listing those it takes; a bad option value raises
    the policy's own ``TypeError`` or ``ValueError``.
    """
    scheduler: Scheduler = SCHEDULERS.build(name, **options)
    return scheduler
