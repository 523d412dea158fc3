"""The critical learning rate's line search and its summary (sweeper.stability.experimental), on losses whose critical
multiple is known: a quadratic along the update, ``L(m) = L0 - a m + b m^2``, rises above ``L0`` from ``m = a / b``."""

import math

import pytest

from sweeper.stability.experimental import critical_multiples, critical_rate_of, line_search_points


def _quadratics(*critical: float):
    """evaluate(m) for rows whose loss rises above its start from ``critical[i]`` on, and the calls made."""
    calls: list[float] = []

    def evaluate(m: float) -> list[float]:
        calls.append(m)
        return [2.0 - m + m * m / c for c in critical]

    return evaluate, calls


@pytest.mark.parametrize("critical", [0.3, 1.0, 7.0, 50.0, 900.0])
def test_the_search_brackets_the_known_critical_multiple_to_its_resolution(critical):
    evaluate, calls = _quadratics(critical)
    [bracket], forwards = critical_multiples(evaluate)
    assert not bracket.censored
    assert bracket.held <= critical <= bracket.rose  # at exactly the critical multiple the loss is back at L0
    assert bracket.rose / bracket.held == pytest.approx(2.0)  # a factor of 4, halved once
    assert forwards == len(calls) and calls[0] == 0.0
    assert forwards <= 8


def test_every_forward_serves_every_row_and_a_warm_start_saves_forwards():
    evaluate, calls = _quadratics(5.0, 40.0)
    brackets, cold = critical_multiples(evaluate)
    assert [b.held < c <= b.rose for b, c in zip(brackets, (5.0, 40.0))] == [True, True]
    _, warm = critical_multiples(_quadratics(5.0, 40.0)[0], start=4.0)
    assert warm < cold


def test_a_row_that_never_rises_in_range_is_a_censored_bound_and_a_nan_is_a_rise():
    never = lambda m: [2.0 - m]  # noqa: E731 - a descent that never turns
    [bracket], _ = critical_multiples(never)
    assert bracket.censored and bracket.rose is None and bracket.multiple == bracket.held
    nan_at_8 = lambda m: [math.nan if m >= 8 else 2.0 - m]  # noqa: E731
    [bracket], _ = critical_multiples(nan_at_8)
    assert bracket.held < 8 <= bracket.rose
    with pytest.raises(ValueError, match="finite"):
        critical_multiples(lambda m: [math.inf])


def test_line_search_points_spread_over_the_constant_phase_and_end_at_its_last_step():
    assert line_search_points(12) == [2, 7, 12]
    assert line_search_points(40) == [2, 21, 40]
    assert line_search_points(2) == [2]
    assert line_search_points(1) == []


def test_a_falling_critical_rate_is_projected_to_the_step_it_meets_the_trials_own():
    # log multiple falls 0.05 a step from 16x at step 0: meets 1x at step ln(16) / 0.05 = 55.5
    noise = {0: 0.95, 1: 1.05}
    readings = [(s, row, 16 * math.exp(-0.05 * s) * noise[row], False) for s in (2, 7, 12) for row in (0, 1)]
    rate = critical_rate_of(readings, max_steps=12)
    assert rate.slope_per_step == pytest.approx(-0.05, abs=1e-3)
    assert 50 <= rate.projected_step <= 61
    assert rate.projected_step_low <= rate.projected_step <= rate.projected_step_high
    assert rate.multiple_low < rate.end_multiple < rate.multiple_high


def test_a_flat_or_rising_critical_rate_is_not_projected():
    flat = [(s, row, 20.0 * (1.1 if row else 0.9), False) for s in (2, 7, 12) for row in (0, 1)]
    assert critical_rate_of(flat, max_steps=12).projected_step is None
    rising = [(s, 0, 5.0 + s, False) for s in (2, 7, 12)]
    assert critical_rate_of(rising, max_steps=12).projected_step is None
    assert critical_rate_of([], max_steps=12).multiple is None
