"""conftest's at_a_dilation_that_keeps_up, alone (the system tests that use it need root): it
stops at the first time dilation that keeps up, records the K it used, and fails above its cap."""

import pytest


def test_the_first_dilation_that_keeps_up_is_used_and_recorded(at_a_dilation_that_keeps_up, request, capsys):
    runs = []
    result, k = at_a_dilation_that_keeps_up(lambda k: runs.append(k) or 10 * k, (4, 16, 64), good=lambda r: r >= 160,
                                            describe=str)
    assert (result, k, runs) == (160, 16, [4, 16])
    assert ("time_dilation", 16) in request.node.user_properties
    assert ("time_dilations_tried", [4, 16]) in request.node.user_properties
    assert "time dilation 16 (tried [4, 16], cap 64)" in capsys.readouterr().out


def test_none_kept_up_fails_naming_every_k_tried_and_the_cap(at_a_dilation_that_keeps_up, request):
    with pytest.raises(pytest.fail.Exception, match=r"up to the cap of 16: K = 4: 40; K = 16: 160$"):
        at_a_dilation_that_keeps_up(lambda k: 10 * k, (4, 16), good=lambda r: False, cap=16, describe=str)
    assert ("time_dilations_tried", [4, 16]) in request.node.user_properties


def test_a_dilation_above_the_cap_is_refused_before_any_run(at_a_dilation_that_keeps_up):
    with pytest.raises(ValueError, match=r"\[256\] are above the cap of 64"):
        at_a_dilation_that_keeps_up(pytest.fail, (4, 256))


def test_a_run_that_chooses_its_own_k_skips_the_ks_it_passed(at_a_dilation_that_keeps_up):
    runs = []

    def run(k):
        runs.append(k)
        return {"dilation": 16 if k is None else k}

    result, k = at_a_dilation_that_keeps_up(run, (None, 16, 64), good=lambda r: r["dilation"] == 64, describe=str,
                                            used=lambda result, k: result["dilation"])
    assert (k, runs) == (64, [None, 64])  # it chose 16 itself: 16 is not run again
