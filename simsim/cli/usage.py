"""``UsageError``: a command-line flag broke a rule."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A command-line flag (or a combination of flags) broke a rule.

    The message names the flag and the rule, ``"--seed: must be >= 0, got -1"``;
    ``simsim`` prints it as ``simsim: error: <message>`` and exits with status 2, as it
    does for a bad scenario file (:class:`~simsim.scenario.ScenarioError`).
    """

    def __init__(self, flag: str, rule: str) -> None:
        self.flag = flag
        self.rule = rule
        super().__init__(f"{flag}: {rule}")
