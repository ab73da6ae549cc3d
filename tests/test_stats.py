"""The one percentile definition (mrc_emu/stats.py): nearest rank, over values and over histograms."""

import pytest

from mrc_emu.stats import histogram_percentile, nearest_rank, percentile


def test_percentiles_are_values_that_occurred():
    xs = list(range(1, 101))
    assert percentile(xs, 50) == 50 and percentile(xs, 99) == 99 and percentile(xs, 100) == 100
    assert percentile(reversed(xs), 0) == 1  # the values need not come sorted
    assert percentile([7.5], 99) == 7.5
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_the_median_of_an_even_count_is_the_lower_middle_and_whole_percentiles_are_exact():
    assert percentile([4, 1, 3, 2], 50) == 2
    assert nearest_rank(100, 7) == 7  # not 8, as 7 / 100 * 100 = 7.000000000000001 would round up
    assert nearest_rank(3, 0) == 1
    with pytest.raises(ValueError, match="between 0 and 100"):
        nearest_rank(3, -1)


def test_a_histograms_percentile_is_the_bucket_holding_the_nearest_rank():
    assert histogram_percentile([0, 0, 0], 50) is None
    assert histogram_percentile([10, 0, 0, 0, 0, 90], 50) == 5  # the 50th of 100 is in bucket 5
    assert histogram_percentile([10, 0, 0, 0, 0, 90], 10) == 0  # the 10th is the last of bucket 0
    assert histogram_percentile([0, 3, 0, 1], 0) == 1  # the smallest counted, never an empty bucket
    assert histogram_percentile([0, 3, 0, 1], 100) == 3
