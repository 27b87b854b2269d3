"""Small, exact statistics for the sensitivity block of a cert (pure Python, no scipy).

* :func:`rule_of_three` - with zero events in ``n`` independent trials, ``3 / n`` is an
  approximate one-sided 95% upper bound on the event rate.
* :func:`clopper_pearson` - the exact two-sided binomial confidence interval, found by
  bisection on the binomial tail, which is computed through the regularized incomplete beta
  function (a continued fraction evaluated in log space so that large ``n`` stays stable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_EPS = 1e-15
_TINY = 1e-300
_MAX_CF_ITER = 100_000
_BISECT_ITER = 200


@dataclass(frozen=True)
class Interval:
    """A closed interval ``[low, high]`` on the rate scale."""

    low: float
    high: float


def rule_of_three(n: int) -> float | None:
    """``3 / n``, the approximate 95% upper bound with zero events; ``None`` when ``n <= 0``."""
    if n <= 0:
        return None
    return 3.0 / n


def _nonzero(value: float) -> float:
    """``value``, or the tiny floor Lentz's method uses instead of an exact zero."""
    return _TINY if abs(value) < _TINY else value


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta function (modified Lentz)."""
    qab = a + b
    qap = a + 1.0
    qam = a - 1.0
    c = 1.0
    d = 1.0 / _nonzero(1.0 - qab * x / qap)
    h = d
    for m in range(1, _MAX_CF_ITER + 1):
        m2 = 2 * m
        even = m * (b - m) * x / ((qam + m2) * (a + m2))
        odd = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        delta = 1.0
        for numerator in (even, odd):  # each iteration is two Lentz steps
            d = 1.0 / _nonzero(1.0 + numerator * d)
            c = _nonzero(1.0 + numerator / c)
            delta = d * c
            h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b)``, the regularized incomplete beta function, for ``a, b > 0``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    # The continued fraction converges fast on this side of the mean; use symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def binom_cdf(k: int, n: int, p: float) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, p)``."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return regularized_beta(n - k, k + 1, 1.0 - p)


def _bisect_decreasing(fn_target: float, k: int, n: int, upper_tail: bool) -> float:
    """Find ``p`` where the chosen binomial tail equals ``fn_target`` by bisection."""
    lo, hi = 0.0, 1.0
    for _ in range(_BISECT_ITER):
        mid = (lo + hi) / 2.0
        if upper_tail:
            # P(X >= k | p) grows with p.
            value = 1.0 - binom_cdf(k - 1, n, mid)
            if value < fn_target:
                lo = mid
            else:
                hi = mid
        else:
            # P(X <= k | p) shrinks with p.
            value = binom_cdf(k, n, mid)
            if value > fn_target:
                lo = mid
            else:
                hi = mid
        if hi - lo < 1e-14:
            break
    return (lo + hi) / 2.0


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> Interval:
    """The exact (Clopper-Pearson) two-sided interval for ``k`` events in ``n`` trials.

    Raises :class:`ValueError` unless ``0 <= k <= n`` and ``n > 0`` and
    ``0 < confidence < 1``.
    """
    if n <= 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 1.0 - confidence
    low = 0.0 if k == 0 else _bisect_decreasing(alpha / 2.0, k, n, upper_tail=True)
    high = 1.0 if k == n else _bisect_decreasing(alpha / 2.0, k, n, upper_tail=False)
    return Interval(low=low, high=high)
