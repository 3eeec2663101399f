"""Descriptive statistics."""

import math


def mean(values):
    """Arithmetic mean; raises ``ValueError`` on an empty sequence."""
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values):
    """Middle value (mean of the two middle values for an even count)."""
    if not values:
        raise ValueError("median of an empty sequence")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def mode(values):
    """Most frequent value; the smallest one on ties."""
    if not values:
        raise ValueError("mode of an empty sequence")
    counts = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    best = max(counts.values())
    return min(value for value, count in counts.items() if count == best)


def variance(values, sample=False):
    """Population variance, or sample variance (n - 1 denominator) if ``sample``."""
    n = len(values)
    if n < 2 and sample:
        raise ValueError("sample variance needs at least two values")
    centre = mean(values)
    squares = sum((value - centre) ** 2 for value in values)
    return squares / (n - 1 if sample else n)


def stdev(values, sample=False):
    """Standard deviation."""
    return math.sqrt(variance(values, sample=sample))


def percentile(values, fraction):
    """Linear-interpolated percentile, ``fraction`` in [0, 1]."""
    if not 0 <= fraction <= 1:
        raise ValueError("fraction must lie in [0, 1]")
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(math.floor(position))
    high = min(low + 1, len(ordered) - 1)
    weight = position - low
    return ordered[low] * (1 - weight) + ordered[high] * weight
