"""The front's volume (sweeper.study._pareto): the hypervolume by Optuna's WFG, the points that count, and the
reference point that lets the worst trial count too."""

import pytest

from sweeper.study._pareto import hypervolume, reference_point


def test_the_hypervolume_counts_only_points_inside_the_reference():
    ref = [2.0, 1.0]
    assert hypervolume([[1.0, 0.5]], ref) == pytest.approx(0.5)
    assert hypervolume([[1.0, 0.5], [1.5, 0.8]], ref) == pytest.approx(0.5)  # dominated: adds nothing
    assert hypervolume([[1.0, 0.5], [1.5, 0.2]], ref) == pytest.approx(0.5 + 0.5 * 0.3)
    assert hypervolume([[3.0, 0.1]], ref) == 0.0  # beyond the reference point
    assert hypervolume([], ref) == 0.0


def test_the_reference_point_is_a_tenth_of_the_range_beyond_the_worst():
    reference = reference_point([[1.0, 0.2], [3.0, 0.4]])
    assert reference == pytest.approx([3.2, 0.42])
    assert hypervolume([[3.0, 0.4]], reference) > 0  # the worst trial counts
