"""Exact binomial interval and rule of three against published values."""

from __future__ import annotations

import math

import pytest

from batch_invariance.core.stats import binom_cdf, clopper_pearson, rule_of_three


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # R: binom.test(k, n)$conf.int
        (5, 10, 0.1870860, 0.8129140),
        (1, 100, 0.0002531460, 0.0544593854),
        (0, 10, 0.0, 0.3084971),
        (10, 10, 0.6915029, 1.0),
    ],
)
def test_clopper_pearson_matches_reference(k: int, n: int, low: float, high: float) -> None:
    ci = clopper_pearson(k, n)
    assert ci.low == pytest.approx(low, abs=2e-7)
    assert ci.high == pytest.approx(high, abs=2e-7)


def _brute_bound(k: int, n: int, upper: bool) -> float:
    """Bisection on the binomial tail summed term by term (independent of the beta route)."""

    def cdf(j: int, p: float) -> float:
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(j + 1))

    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if upper:
            lo, hi = (mid, hi) if cdf(k, mid) > 0.025 else (lo, mid)
        else:
            lo, hi = (mid, hi) if 1 - cdf(k - 1, mid) < 0.025 else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize(("k", "n"), [(1, 7), (3, 40), (2, 33), (12, 60), (59, 60)])
def test_clopper_pearson_matches_direct_summation(k: int, n: int) -> None:
    ci = clopper_pearson(k, n)
    assert ci.low == pytest.approx(_brute_bound(k, n, upper=False), abs=1e-9)
    assert ci.high == pytest.approx(_brute_bound(k, n, upper=True), abs=1e-9)


def test_clopper_pearson_closed_forms_at_the_edges() -> None:
    # With k = 0 the upper bound is 1 - (alpha/2)^(1/n); with k = n the lower is (alpha/2)^(1/n).
    n = 250
    assert clopper_pearson(0, n).high == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-9)
    assert clopper_pearson(n, n).low == pytest.approx(0.025 ** (1 / n), rel=1e-9)


def test_clopper_pearson_large_n_is_stable_and_contains_the_rate() -> None:
    ci = clopper_pearson(400, 800_000)
    assert ci.low < 400 / 800_000 < ci.high
    assert 0 < ci.low < ci.high < 1


def test_clopper_pearson_rejects_bad_input() -> None:
    for k, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError):
            clopper_pearson(k, n)
    with pytest.raises(ValueError):
        clopper_pearson(1, 5, confidence=1.0)


def test_binom_cdf_small_cases() -> None:
    assert binom_cdf(0, 3, 0.5) == pytest.approx(0.125)
    assert binom_cdf(1, 3, 0.5) == pytest.approx(0.5)
    assert binom_cdf(3, 3, 0.5) == 1.0
    assert binom_cdf(-1, 3, 0.5) == 0.0


def test_rule_of_three() -> None:
    assert rule_of_three(30) == pytest.approx(0.1)
    assert rule_of_three(0) is None
