import pytest

from numkit.stats import mean, median, mode, percentile, stdev, variance


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_median_odd():
    assert median([3, 1, 2]) == 2


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_mode_ties_smallest():
    assert mode([3, 3, 1, 1, 2]) == 1


def test_variance_population():
    assert variance([1, 2, 3, 4]) == 1.25


def test_variance_sample():
    assert variance([1, 2, 3, 4], sample=True) == pytest.approx(5 / 3)


def test_variance_sample_too_short():
    with pytest.raises(ValueError):
        variance([1], sample=True)


def test_stdev():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9]) == 2.0


def test_percentile():
    assert percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert percentile([1, 2, 3, 4], 0.25) == pytest.approx(1.75)
    assert percentile([10, 20], 1.0) == 20


def test_percentile_bad_fraction():
    with pytest.raises(ValueError):
        percentile([1], 1.5)
