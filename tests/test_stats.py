"""The mergeable histograms that the training process and the collector both build."""
import random

import pytest

from starvewatch.stats import LogHistogram, bucket_of, bucket_value


EDGES = [0, 1, 2, 3, 31, 32, 33, 63, 64, 65, 127, 128, 1000, 2**31 - 1, 2**31, 2**52 + 7]


def _values(seed: int) -> list[int]:
    rng = random.Random(seed)
    return (EDGES + [rng.randint(0, 10**12) for _ in range(5000)]
            + [int(rng.lognormvariate(13, 0.1)) for _ in range(5000)] + [rng.randint(0, 300) for _ in range(500)])


def test_the_training_side_and_the_collector_side_bucket_identically():
    for seed in range(3):
        values = _values(seed)
        one_by_one, sorted_side, numpy_side = LogHistogram(), LogHistogram(), LogHistogram()
        for v in values:
            one_by_one.add(v)
        sorted_side.add_many(values)                  # the training process: no numpy
        numpy_side.add_many(values, vectorized=True)  # the collector
        assert sorted_side.counts == numpy_side.counts == one_by_one.counts
        assert sorted_side.count == numpy_side.count == len(values)
        assert sorted_side.total == numpy_side.total == sum(values)
        assert sorted_side.maximum == numpy_side.maximum == max(values)


def test_quantiles_are_within_the_bucket_width():
    values = sorted(int(random.Random(7).lognormvariate(15, 1.0)) for _ in range(20_000))
    h = LogHistogram()
    h.add_many(values)
    for q in (0.5, 0.95, 0.99):
        exact = values[int(q * len(values)) - 1]
        assert abs(h.quantile(q) - exact) / exact < 0.02
    assert bucket_value(bucket_of(1_000_000)) == pytest.approx(1_000_000, rel=0.016)



def test_variance_from_the_buckets_is_within_a_few_percent():
    rng = random.Random(7)
    values = [int(rng.lognormvariate(16, 0.6)) for _ in range(20_000)]
    h = LogHistogram()
    h.add_many(values)
    mean = sum(values) / len(values)
    exact = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    assert h.variance() == pytest.approx(exact, rel=0.04)
    one = LogHistogram()
    one.add(5)
    assert one.variance() is None  # a spread needs two values
