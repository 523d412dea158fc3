"""The chance of diverging within the run (issue 66): the frozen model, its call, the edge and the safe rate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sweeper.stability._chance import DIVERGENCE_MODEL, SAFE_UPPER, call_of, divergence_chance

FIT = Path(__file__).parents[2] / "benchmarks" / "stability" / "results" / "divergence_chance_fit.json"


def test_the_frozen_model_is_the_registered_fit():
    fit = json.loads(FIT.read_text())
    m = DIVERGENCE_MODEL
    assert (m.mu, m.gamma, m.log_sigma) == pytest.approx((fit["mu"], fit["gamma"], fit["log_sigma"]), rel=1e-12)
    flat = [x for row in fit["covariance_mu_gamma_log_sigma"] for x in row]
    assert [x for row in m.covariance for x in row] == pytest.approx(flat, rel=1e-12)
    assert (m.slope, m.slope_low, m.slope_high) == pytest.approx(
        (fit["slope_median"], fit["slope_low"], fit["slope_high"]), rel=1e-12
    )
    from sweeper.stability._margin import MARGIN_SEED_SD_STEPS

    assert pytest.approx(fit["margin_seed_sd_steps"], abs=5e-4) == MARGIN_SEED_SD_STEPS


def test_the_chance_falls_with_the_margin_and_grows_with_the_horizon():
    rungs = [1.8**k for k in range(1, 12)]
    for horizon in (60, 200, 400, 2000):
        ps = [DIVERGENCE_MODEL.chance(m, horizon) for m in rungs]
        assert all(low <= p <= high for p, low, high in ps)
        assert all(a[0] > b[0] for a, b in zip(ps, ps[1:]))
    assert DIVERGENCE_MODEL.chance(10.5, 400)[0] > DIVERGENCE_MODEL.chance(10.5, 200)[0]
    # the registered table (docs/validity.md): 5.83 fails 60% of 200-step runs, 18.9 about 1%
    assert DIVERGENCE_MODEL.chance(5.832, 200)[0] == pytest.approx(0.60, abs=0.01)
    assert DIVERGENCE_MODEL.chance(18.9, 200)[0] == pytest.approx(0.013, abs=0.002)
    with pytest.raises(ValueError, match="positive"):
        DIVERGENCE_MODEL.chance(0.0, 200)


def test_the_call_follows_the_registered_thresholds():
    calls = {m: divergence_chance(1e-3, m, False, 200).call for m in (3.24, 5.832, 10.5, 18.9, 34.0, 61.2)}
    assert calls == {3.24: "likely fails", 5.832: "likely fails", 10.5: "undecided", 18.9: "undecided",
                     34.0: "safe", 61.2: "safe"}  # fmt: skip
    assert (
        call_of(0.02, 0.049) == "safe" and call_of(0.02, 0.05) == "undecided" and call_of(0.51, 0.9) == "likely fails"
    )


def test_the_edge_and_the_safe_rate_sit_where_their_chance_says():
    m, lr, horizon = 61.2, 2e-3, 200
    found = divergence_chance(lr, m, False, horizon)
    model = DIVERGENCE_MODEL
    # at the edge the configuration's margin falls (by the median slope) to the one with P = 50%
    k = found.predicted_max_lr / lr
    assert model.chance(m * k**-model.slope, horizon)[0] == pytest.approx(0.5, abs=1e-6)
    assert found.predicted_max_lr_low < found.predicted_max_lr < found.predicted_max_lr_high
    # raising the rate to the safe rate, at the steepest slope measured, leaves P's upper end at 5%
    k_safe = found.safe_learning_rate / lr
    assert k_safe > 1 and model.chance(m * k_safe**-model.slope_high, horizon)[2] == pytest.approx(SAFE_UPPER, rel=1e-3)
    assert found.safe_learning_rate < found.predicted_max_lr_low
    # a trial that is not safe is told the lower rate that would be, at the shallowest slope (the least gain)
    risky = divergence_chance(lr, 5.832, False, horizon)
    k_down = risky.safe_learning_rate / lr
    assert k_down < 1 and model.chance(5.832 * k_down**-model.slope_low, horizon)[2] == pytest.approx(0.05, rel=1e-3)


def test_a_capped_margin_gives_upper_bounds_and_unknowns_give_nothing():
    capped = divergence_chance(2e-4, 1.8**11, True, 400)
    assert capped.at_most and capped.predicted_max_lr_high is None and capped.call == "safe"
    assert divergence_chance(None, 10.0, False) is None and divergence_chance(2e-4, None, None) is None
    assert divergence_chance(2e-4, math.nan, False) is None
    with pytest.raises(ValueError, match="horizon_steps"):
        divergence_chance(2e-4, 10.0, False, 0)


def test_sweep_calibrate_refits_the_intercept_from_the_users_edges():
    """Issue 66, item 4: what varies by model is the intercept; edges bisected on the user's model give it back, and
    the study's chance moves with it (a model whose runs fail later: a smaller P at the same margin)."""
    from sweeper.stability import refit_mu
    from sweeper.stability._margin import LrCalibration

    model, later = DIVERGENCE_MODEL, DIVERGENCE_MODEL.mu + 0.5

    def edge(margin: float, horizon: int) -> tuple[float, float, int]:  # where P = 50% under mu = later
        ln_e = (later + model.gamma * math.log(margin) - math.log(horizon)) / (model.gamma * model.slope)
        return margin, math.exp(ln_e), horizon

    mu, se = refit_mu([edge(10.5, 200), edge(34.0, 400), edge(61.2, 120)])
    assert mu == pytest.approx(later) and se == pytest.approx(math.sqrt(model.covariance[0][0]) / math.sqrt(3))
    calibrated = LrCalibration(factor=0.1, gsd=1.2, edges=3, source="calibrated (3)", calibrated=True, mu=mu, mu_se=se)
    p_built_in = model.chance(18.9, 400)[0]
    assert calibrated.chance_model.chance(18.9, 400)[0] < p_built_in and "mu refitted" in calibrated.chance_model.source
    with pytest.raises(ValueError, match="no edge"):
        refit_mu([])
