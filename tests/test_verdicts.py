"""The seed table's verdict rule (reports/verdicts.py) at its edges: each verdict's range on the
ratio's axis, an interval inside one range or across two, too few pairs, and the intervals a
ratio of two medians carries."""

import math

import pytest

from proxytune.reports import verdicts


@pytest.mark.parametrize("ratio, original, expected", [
    (0.5, 2.0, "reversed"), (1 / 1.1 - 1e-9, 2.0, "reversed"), (1 / 1.1, 2.0, "shrank"), (1.0, 2.0, "shrank"),
    (1.05, 2.0, "shrank"), (math.sqrt(2) - 1e-9, 2.0, "shrank"), (math.sqrt(2), 2.0, "holds"), (3.9, 2.0, "holds"),
    (4.0, 2.0, "holds"), (4.0 + 1e-9, 2.0, "grew"), (0.95, 1.53, "shrank"), (209.7, 78.9, "holds"),
    (7000, 78.9, "grew")])
def test_each_ratio_falls_in_one_verdicts_range(ratio, original, expected):
    assert verdicts.range_of(ratio, original) == expected


def test_the_edges_are_where_the_ranges_meet():
    e = verdicts.edges(2.0)
    assert e == pytest.approx({"reversed|shrank": 1 / 1.1, "shrank|holds": math.sqrt(2), "holds|grew": 4.0})
    for edge, (below, above) in (("reversed|shrank", ("reversed", "shrank")), ("shrank|holds", ("shrank", "holds")),
                                 ("holds|grew", ("holds", "grew"))):
        assert verdicts.range_of(e[edge] * 0.999, 2.0) == below and verdicts.range_of(e[edge] * 1.001, 2.0) == above


def test_an_interval_inside_one_range_gives_its_verdict():
    m = verdicts.paired([1.6, 1.9, 1.7, 1.75, 1.65])
    assert m["median"] == 1.7 and m["interval"] == [1.6, 1.9] and m["reps"] == 5
    assert m["coverage"] == pytest.approx(0.9375)
    v, why = verdicts.decide(m, 2.0)
    assert v == "holds" and "x1.60 to x1.90 over 5 pairs, 94% interval" in why


def test_an_interval_across_an_edge_is_inconclusive_with_what_would_settle_it():
    v, why = verdicts.decide(verdicts.paired([1.3, 1.5, 1.45, 1.48, 1.46]), 2.0)   # sqrt(2) = 1.414 lies inside
    assert v == "inconclusive here"
    assert "spans shrank to holds" in why and "--full" in why
    v, _ = verdicts.decide(verdicts.paired([0.85, 0.95, 1.3, 1.0, 1.1]), 1.53)  # reversed to shrank
    assert v == "inconclusive here"


@pytest.mark.parametrize("ratios", [[2.0], [2.0, 2.1], [2.0, 2.1, 1.9], [2.0, 2.1, 1.9, 2.05],
                                    [float("nan"), 2.0, 2.1, 1.9, None, 2.05]])
def test_fewer_than_five_pairs_is_inconclusive_whatever_they_say(ratios):
    """3 pairs' range holds the median in 75 % of runs: a row near an edge would move run by run."""
    v, why = verdicts.decide(verdicts.paired(ratios), 2.0)
    assert v == "inconclusive here" and "a verdict takes 5 at least" in why
    assert verdicts.decide(verdicts.paired(ratios + [2.02] * 5), 2.0)[0] == "holds"


def test_no_pair_is_not_measurable():
    assert verdicts.paired([]) is None and verdicts.paired([None, float("nan"), -1.0]) is None
    assert verdicts.decide(None, 2.0)[0] == "not measurable here"


def test_a_side_that_served_nothing_is_a_pair_at_the_end_of_the_range():
    m = verdicts.paired([0.0, 0.5, 0.6, 0.55, 0.5])      # B served nothing in one pair
    assert m["interval"] == [0.0, 0.6] and verdicts.decide(m, 2.0)[0] == "reversed"
    m = verdicts.paired([5.0, float("inf"), 6.0, 5.5, 5.2])   # A served nothing in one pair
    assert m["interval"][1] == float("inf") and verdicts.decide(m, 2.0)[0] == "grew"


def test_a_ratio_of_two_medians_carries_the_ratio_of_their_intervals():
    a = {"median": 200.0, "ci95": [190.0, 210.0], "min": 190.0, "max": 210.0, "n": 5}
    b = {"median": 2.0, "ci95": [1.9, 2.1], "min": 1.9, "max": 2.1, "n": 5}
    q = verdicts.quotient(verdicts.of_summary(a), verdicts.of_summary(b))
    assert q["median"] == 100.0 and q["interval"] == pytest.approx([190 / 2.1, 210 / 1.9])
    assert q["reps"] == 5 and q["coverage"] == pytest.approx(0.875)       # each range holds 93.75 %
    assert "over 5 repetitions" in verdicts.decide(q, 100.0)[1]
    wider = verdicts.of_summary({"median": 2.0, "ci95": [1.95, 2.05], "min": 1.9, "max": 2.1, "n": 9})
    assert wider["coverage"] == 0.95                                      # a bootstrap inside the range
    assert verdicts.of_summary({"median": 2.0, "n": 5})["coverage"] == 0.0
    assert verdicts.decide(q, 100.0)[0] == "holds"
    assert verdicts.quotient(verdicts.of_summary(a), None) is None
    assert verdicts.of_summary({"median": 0.0}) is None


def test_an_interval_inside_one_range_but_within_the_margin_of_an_edge_is_inconclusive():
    """The edge between shrank and holds for x5.9 is x2.43: pairs at x2.45-2.55 lie in holds, but a
    row's median moves ~6 % from report to report, so the next report could put them below it."""
    edge = verdicts.edges(5.9)["shrank|holds"]
    v, why = verdicts.decide(verdicts.paired([2.45, 2.5, 2.55, 2.48, 2.52]), 5.9)
    assert v == "inconclusive here" and f"within 10% of the shrank and holds edge (x{edge:.2f})" in why, why
    v, why = verdicts.decide(verdicts.paired([2.05, 2.1, 2.15, 2.2, 2.25]), 5.9)     # below it, 2.25 x 1.1 > 2.43
    assert v == "inconclusive here" and "within 10%" in why
    # clear of every edge by more than the margin, on either side: a verdict
    assert verdicts.decide(verdicts.paired([r * 1.101 for r in (edge,) * 5]), 5.9)[0] == "holds"
    assert verdicts.decide(verdicts.paired([edge / 1.101] * 5), 5.9)[0] == "shrank"
    # the reversed edge (x0.91) has the margin too: x0.95-1.0 is no longer "shrank" for sure
    assert verdicts.decide(verdicts.paired([0.95, 0.97, 1.0, 0.96, 0.98]), 2.0)[0] == "inconclusive here"
    assert verdicts.decide(verdicts.paired([1.01, 1.02, 1.03, 1.02, 1.01]), 2.0)[0] == "shrank"
