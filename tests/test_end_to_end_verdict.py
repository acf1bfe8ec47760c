"""benchmarks/end_to_end.py's verdict on interleaved pairs (the measurement itself is a
benchmark, run by hand: python benchmarks/end_to_end.py)."""
from benchmarks.end_to_end import slower_beyond_noise


def test_slower_only_when_the_median_and_nearly_every_pair_say_so():
    assert slower_beyond_noise([0.7, 0.8, 0.75, 0.85, 0.6], 0.10)
    assert not slower_beyond_noise([0.7, 0.8, 1.2, 1.3, 0.6], 0.10)      # median 0.8, but 2 pairs faster
    assert not slower_beyond_noise([0.95, 0.92, 0.97, 0.93, 0.99], 0.10)  # every pair slower, within noise
    assert not slower_beyond_noise([1.5, 1.4, 1.6], 0.10)
    assert not slower_beyond_noise([], 0.10)
