"""One message per kind of argument check (issue 25, point 9)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import simsim
from simsim.checks import (
    INT64_MAX,
    check_choice,
    check_int,
    check_positive_int,
    check_real,
    did_you_mean,
    overflow,
)


def test_check_int_converts_index_types_and_refuses_bools() -> None:
    assert check_int(np.int64(5), "n") == 5
    assert type(check_int(np.int64(5), "n")) is int
    with pytest.raises(TypeError, match="n must be an int, got bool True"):
        check_int(True, "n")
    with pytest.raises(TypeError, match=r"n must be an int, got float 1\.0"):
        check_int(1.0, "n")
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        check_int(-1, "n")
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        check_positive_int(0, "n")
    with pytest.raises(OverflowError, match=r"n = 9223372036854775808 is past the 64-bit limit"):
        check_int(INT64_MAX + 1, "n")


def test_every_overflow_reads_the_same() -> None:
    assert str(overflow("x", 3, " us")) == "x = 3 us is past the 64-bit limit 2**63 - 1"
    # The linear backend's two methods used a shorter wording of their own.
    big = simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(
            prefill_per_token_us=INT64_MAX, decode_per_active_sequence_us=INT64_MAX
        )
    )
    with pytest.raises(OverflowError) as prefill:
        big.prefill_us(2, 1)
    with pytest.raises(OverflowError) as decode:
        big.decode_step_us(2)
    with pytest.raises(OverflowError) as count:
        simsim.SimulatedBackendConfig(decode_base_us=INT64_MAX + 1)
    for raised in (prefill, decode, count):
        assert str(raised.value).endswith("is past the 64-bit limit 2**63 - 1")
    assert str(prefill.value).startswith(f"prefill_us(2, 1) = {2 * INT64_MAX} us")


def test_check_real_is_one_rule_with_one_wording() -> None:
    assert check_real(2, "w") == 2.0 and type(check_real(2, "w")) is float
    assert type(check_real(2, "w", keep_int=True)) is int
    assert check_real(Fraction(1, 2), "w") == 0.5
    with pytest.raises(TypeError, match="w must be a number, got bool True"):
        check_real(True, "w")
    with pytest.raises(TypeError, match="w must be a number of microseconds, got str '1'"):
        check_real("1", "w", unit=" microseconds")
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="w must be a finite number >= 0, got"):
            check_real(bad, "w")
    # The three copies it replaced now say the same thing.
    with pytest.raises(ValueError, match="decode_base_us must be a finite number >= 0"):
        simsim.FittedBackendConfig(decode_base_us=-1.0)
    with pytest.raises(ValueError, match="'queue' must be a finite number >= 0"):
        simsim.cluster.WeightedRouter({"queue": -1.0})
    with pytest.raises(ValueError, match="output_weight must be a finite number >= 0"):
        simsim.schedulers.FairShareScheduler(output_weight=-1)


def test_a_choice_guesses_a_misspelt_name() -> None:
    assert did_you_mean("queu", ["queue", "prefix"]) == " (did you mean 'queue'?)"
    assert did_you_mean("zzz", ["queue"]) == ""
    assert check_choice("b", "letter", ["a", "b"]) == "b"
    with pytest.raises(
        ValueError, match=r"unknown letter 'bb' \(did you mean 'b'\?\); known letters: a, b"
    ):
        check_choice("bb", "letter", ["b", "a"])
    with pytest.raises(TypeError, match="a letter name must be a str, got int 3"):
        check_choice(3, "letter", ["a"])
