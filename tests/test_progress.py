"""The command line's progress bar: silent on quick runs and off a terminal."""

from __future__ import annotations

import io

from simsim.cli import ProgressBar


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_after_the_delay_and_ends_the_line() -> None:
    stream = FakeTerminal()
    bar = ProgressBar(stream, "simulating", delay_s=0.0)
    bar(5, 20)
    bar(20, 20)
    text = stream.getvalue()
    assert "\rsimulating [#######-----------------------] 5/20" in text
    assert "\rsimulating [##############################] 20/20" in text
    assert text.endswith("\n")


def test_progress_bar_stays_silent_on_a_quick_run() -> None:
    stream = FakeTerminal()
    bar = ProgressBar(stream, "simulating", delay_s=60.0)
    bar(5, 20)
    bar(20, 20)
    assert stream.getvalue() == ""


def test_progress_bar_stays_silent_off_a_terminal() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream, "simulating", delay_s=0.0)
    bar(5, 20)
    bar(20, 20)
    assert stream.getvalue() == ""
