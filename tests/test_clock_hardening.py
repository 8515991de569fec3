"""Time conversions and time errors found by probes (issue 12, points 3 and 7)."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

import simsim


@pytest.mark.parametrize("convert", [simsim.seconds_to_us, simsim.ms_to_us])
@pytest.mark.parametrize("value", [1e300, 1e308, Decimal("1e400"), Fraction(10**40)])
def test_a_huge_value_is_an_overflow_error_naming_the_value(convert: object, value: object) -> None:
    with pytest.raises(OverflowError, match=r"past the 64-bit limit of 2\*\*63 - 1 microseconds"):
        convert(value)  # type: ignore[operator]


@pytest.mark.parametrize("value", [-1e300, Decimal("-1e400"), -0.5])
def test_a_large_negative_value_is_a_value_error(value: object) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        simsim.seconds_to_us(value)  # type: ignore[arg-type]


def test_the_largest_time_still_converts() -> None:
    assert simsim.seconds_to_us(Decimal("9223372036854.775807")) == 2**63 - 1
    with pytest.raises(OverflowError):
        simsim.seconds_to_us(Decimal("9223372036854.775808"))


def test_a_float_delay_error_shows_the_conversion_to_use() -> None:
    env = simsim.Environment()
    with pytest.raises(TypeError, match=r"simsim\.seconds_to_us\(0\.25\)"):
        env.timeout(0.25)
    # The idiom the message teaches is the one that works.
    env.timeout(simsim.seconds_to_us(0.25))
    env.run()
    assert env.now == 250_000
