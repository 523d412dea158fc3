"""The chance that a long run diverges within its horizon, from a short trial's stability margin; the call made from it,
the edge rate (``predicted_max_lr``) and the safe rate on the measured rate scale.

The model and every number here are pre-registered in docs/validity.md ("The chance of diverging within the run:
pre-registration (issue 66)") and fitted by ``benchmarks/stability/divergence_chance.py --fit``
(``benchmarks/stability/results/divergence_chance_fit.json``) on the 102 stored 200-step runs of the built-in model
whose short trial completed. The step ``T`` at which a constant-rate run first fails is log-logistic in the margin ``m``
(an accelerated-failure-time model, Kalbfleisch & Prentice 2002, "The Statistical Analysis of Failure Time Data",
sec. 2.2.6)::

    ln T = mu + gamma ln m + sigma e,  e standard logistic
    P(diverges within H steps) = logistic((ln H - mu - gamma ln m) / sigma)

Within one configuration ``ln m`` falls ``s`` per ``ln`` of the learning rate (measured per configuration on the
equal-step block: median 1.87, 1.00-2.44), so at ``k`` times its rate a configuration's margin is ``m k**-s``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: P's 95% interval: ``z +- Z95 sd(z)`` on the logit.
Z95 = 1.96

#: The call's thresholds: ``safe`` when P's upper end is below :data:`SAFE_UPPER`, ``likely fails`` when P is above
#: :data:`LIKELY_FAILS` (pre-registered, docs/validity.md).
SAFE_UPPER = 0.05
LIKELY_FAILS = 0.5

#: The calls, from a trial that failed by itself to one whose long run is safe.
CALLS = ("fails", "likely fails", "undecided", "safe")

#: The horizon P is given at where the study names none (``study.confirm_steps``): the validation's 400 steps, the
#: window (a NaN at step 200-300) the product exists for.
DEFAULT_HORIZON_STEPS = 400

#: The seed noise of one short trial's margin, in ladder steps (factors of 1.8): the pooled standard deviation of
#: ``log_1.8(margin)`` over seeds of one configuration at one rate (29 groups of the equal-step block,
#: ``margin_seed_sd_steps`` in ``benchmarks/stability/results/divergence_chance_fit.json``). A margin's 95% interval is
#: ``m */ 1.8**(1.96 x 0.404)`` (``*/ 1.59``).
MARGIN_SEED_SD_STEPS = 0.404


def _logistic(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@dataclass(frozen=True, kw_only=True)
class DivergenceModel:
    """The frozen chance-of-diverging model (see the module's docstring) with its uncertainty.

    Attributes:
        mu, gamma, log_sigma: The AFT fit: ``ln T = mu + gamma ln m + exp(log_sigma) e``.
        covariance: The 3 x 3 covariance of (``mu``, ``gamma``, ``log_sigma``), a cluster bootstrap over the fit's
            configurations.
        slope: The within-configuration fall of ``ln m`` per ``ln`` of the rate (the median over configurations).
        slope_low, slope_high: Its range over configurations (the rate scale's interval).
        source: One line for every view: where the model was fitted.
    """

    mu: float
    gamma: float
    log_sigma: float
    covariance: tuple[tuple[float, float, float], tuple[float, float, float], tuple[float, float, float]]
    slope: float
    slope_low: float
    slope_high: float
    source: str

    @property
    def sigma(self) -> float:
        """``exp(log_sigma)``: the spread of ``ln T`` (its logistic scale)."""
        return math.exp(self.log_sigma)

    def _z(self, margin: float, horizon_steps: float) -> tuple[float, float]:
        """The logit of P and its standard deviation (delta method over :attr:`covariance`)."""
        ln_m = math.log(margin)
        z = (math.log(horizon_steps) - self.mu - self.gamma * ln_m) / self.sigma
        grad = (-1.0 / self.sigma, -ln_m / self.sigma, -z)
        var = sum(grad[i] * self.covariance[i][j] * grad[j] for i in range(3) for j in range(3))
        return z, math.sqrt(max(var, 0.0))

    def chance(self, margin: float, horizon_steps: float) -> tuple[float, float, float]:
        """``(P, low, high)``: the chance that a constant-rate run of ``horizon_steps`` steps (> 0) at the trial's
        rate diverges, for a trial of margin ``margin`` (> 0), with its 95% interval.

        Raises:
            ValueError: ``margin`` or ``horizon_steps`` is not a positive finite number.
        """
        if not (math.isfinite(margin) and margin > 0 and math.isfinite(horizon_steps) and horizon_steps > 0):
            raise ValueError(f"margin and horizon_steps must be positive, but got {margin!r} and {horizon_steps!r}")
        z, sd = self._z(margin, horizon_steps)
        return _logistic(z), _logistic(z - Z95 * sd), _logistic(z + Z95 * sd)

    @functools.lru_cache(maxsize=64)  # noqa: B019 (a frozen model of module lifetime: one bisection per horizon)
    def safe_margin(self, horizon_steps: float, upper: float = SAFE_UPPER) -> float:
        """The margin at which P's upper end at ``horizon_steps`` is ``upper`` (P falls with the margin: a larger
        margin is safe), by bisection on ``ln m`` over [1e-3, 1e9]; cached per horizon (a view derives it for
        every stored trial)."""
        lo, hi = math.log(1e-3), math.log(1e9)
        for _ in range(80):
            mid = (lo + hi) / 2
            if self.chance(math.exp(mid), horizon_steps)[2] > upper:
                lo = mid
            else:
                hi = mid
        return math.exp(hi)

    def with_mu(self, mu: float, mu_se: float, source: str) -> DivergenceModel:
        """This model with ``mu`` refitted on a study's own model (:func:`refit_mu`), its standard error ``mu_se``
        replacing ``mu``'s row and column of the covariance (gamma, sigma and the slopes as fitted)."""
        c = self.covariance
        covariance = ((mu_se**2, 0.0, 0.0), (0.0, c[1][1], c[1][2]), (0.0, c[2][1], c[2][2]))
        return dataclasses.replace(self, mu=mu, covariance=covariance, source=source)

    def edge_margin(self, horizon_steps: float) -> tuple[float, float, float]:
        """``(m50, low, high)``: the margin at which P = 50% at ``horizon_steps``, ``exp((ln H - mu) / gamma)``,
        with its 95% interval (delta method over :attr:`covariance`)."""
        a = math.log(horizon_steps) - self.mu
        ln_m50 = a / self.gamma
        grad = (-1.0 / self.gamma, -a / self.gamma**2, 0.0)
        var = sum(grad[i] * self.covariance[i][j] * grad[j] for i in range(3) for j in range(3))
        sd = math.sqrt(max(var, 0.0))
        return math.exp(ln_m50), math.exp(ln_m50 - Z95 * sd), math.exp(ln_m50 + Z95 * sd)


#: The model as fitted and registered (``benchmarks/stability/results/divergence_chance_fit.json``; a test checks they
#: agree).
DIVERGENCE_MODEL = DivergenceModel(
    mu=3.058228830183702,
    gamma=1.2019660834764505,
    log_sigma=-1.2175104767321008,
    covariance=(
        (0.26133439177568735, -0.1348240297239951, -0.03156031998671811),
        (-0.1348240297239951, 0.07137473091522512, 0.01844782534160325),
        (-0.03156031998671811, 0.01844782534160325, 0.01707537030250296),
    ),
    slope=1.8657878573550475,
    slope_low=0.9977898556505339,
    slope_high=2.435291679610255,
    source="fitted on SmolLM2-135M's stored 200-step runs (102 runs, 32 configurations); other horizons extrapolated",
)


def refit_mu(
    edges: Sequence[tuple[float, float, int]], model: DivergenceModel = DIVERGENCE_MODEL
) -> tuple[float, float]:
    """``(mu, its standard error)`` from a study's bisected long-run edges (``sweep calibrate``), each ``(margin,
    edge multiple, horizon steps)``: the trial's margin, the multiple of its rate at which a run of that many steps
    fails about half the time, and that run's length. At the edge the model's P is 50%, so each edge gives
    ``mu_i = ln H - gamma (ln margin - s ln multiple)`` (the margin at ``multiple`` times the rate being
    ``margin * multiple**-s``); ``mu`` is their mean. Its standard error is their standard deviation over
    ``sqrt(n)``, at least the fit's own (one edge says nothing of the spread).

    Raises:
        ValueError: No edges, or one with a margin, multiple or horizon that is not positive.
    """
    if not edges:
        raise ValueError("no edge to refit mu on")
    if any(not (m > 0 and e > 0 and h > 0) for m, e, h in edges):
        raise ValueError(f"edges need a positive margin, multiple and horizon, but got {list(edges)!r}")
    mus = [math.log(h) - model.gamma * (math.log(m) - model.slope * math.log(e)) for m, e, h in edges]
    own = math.sqrt(model.covariance[0][0])
    se = statistics.stdev(mus) / math.sqrt(len(mus)) if len(mus) >= 2 else own
    return statistics.fmean(mus), max(se, own / math.sqrt(len(mus)))


@dataclass(frozen=True, kw_only=True)
class DivergenceChance:
    """What a trial's margin says of a long run at its rate, and at other rates.

    Attributes:
        horizon_steps: The run's length P is for (``study.confirm_steps``, else :data:`DEFAULT_HORIZON_STEPS`).
        p_diverge: The chance that a constant-rate run of ``horizon_steps`` steps at the trial's rate diverges (NaN or
            the probe's divergence), in [0, 1]; an upper bound when ``at_most``.
        p_diverge_low, p_diverge_high: Its 95% interval over configurations (the fit's uncertainty).
        at_most: The margin was capped (the stress phase never diverged): P and its interval are upper bounds.
        call: ``safe`` (``p_diverge_high`` < 5%), ``likely fails`` (``p_diverge`` > 50%) or ``undecided``.
        predicted_max_lr: The edge: the learning rate at which P = 50% at the horizon (a long run there fails about
            half the time), ``learning_rate (m / m50)**(1/s)``; a lower bound when ``at_most``.
        predicted_max_lr_low, predicted_max_lr_high: Its 95% interval: the rate scale ``s`` over its measured range
            and ``m50``'s interval (``high`` None when ``at_most``).
        safe_learning_rate: The largest rate whose P's upper end is 5% at the horizon: the rate to train at for the
            ``safe`` call (above the trial's own rate when it is safe, below it when not).
    """

    horizon_steps: int
    p_diverge: float
    p_diverge_low: float
    p_diverge_high: float
    at_most: bool
    call: str
    predicted_max_lr: float
    predicted_max_lr_low: float
    predicted_max_lr_high: float | None
    safe_learning_rate: float


def call_of(p: float, high: float) -> str:
    """The call of a trial that completed, from its P and P's upper end (pre-registered thresholds)."""
    if high < SAFE_UPPER:
        return "safe"
    return "likely fails" if p > LIKELY_FAILS else "undecided"


def divergence_chance(
    learning_rate: float | None,
    stability_margin: float | None,
    capped: bool | None,
    horizon_steps: int = DEFAULT_HORIZON_STEPS,
    model: DivergenceModel = DIVERGENCE_MODEL,
) -> DivergenceChance | None:
    """The :class:`DivergenceChance` of a trial trained at ``learning_rate`` whose stress phase measured
    ``stability_margin`` (``capped``: a lower bound), for a run of ``horizon_steps`` steps; None when the margin or
    the rate is unknown.

    Raises:
        ValueError: ``horizon_steps`` is not positive.
    """
    if horizon_steps < 1:
        raise ValueError(f"horizon_steps must be at least 1, but got {horizon_steps!r}")
    if learning_rate is None or not learning_rate > 0 or stability_margin is None:
        return None
    if not (math.isfinite(stability_margin) and stability_margin > 0):
        return None
    m = stability_margin
    p, low, high = model.chance(m, horizon_steps)
    m50, m50_low, m50_high = model.edge_margin(horizon_steps)
    ln = math.log

    def rate(target: float, slope: float) -> float:
        return learning_rate * math.exp((ln(m) - ln(target)) / slope)

    edges = [rate(t, s) for t in (m50_low, m50_high) for s in (model.slope_low, model.slope_high)]
    m_safe = model.safe_margin(horizon_steps)
    return DivergenceChance(
        horizon_steps=int(horizon_steps),
        p_diverge=p,
        p_diverge_low=low,
        p_diverge_high=high,
        at_most=bool(capped),
        call=call_of(p, high),
        predicted_max_lr=rate(m50, model.slope),
        predicted_max_lr_low=min(edges),
        predicted_max_lr_high=None if capped else max(edges),
        safe_learning_rate=rate(m_safe, model.slope_high if m > m_safe else model.slope_low),
    )
