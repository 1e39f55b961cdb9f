"""What a plan says of participations (issue 55 item 3): each sampler's cap on one unit's rounds,
checked by brute force over keyed draws, and the lines ``python -m fedpriv.plan`` prints."""

from __future__ import annotations

import numpy as np
import pytest

from fedpriv.sampling import SAMPLERS, make_sampler, participation_lines

KEY = bytes(range(32))


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_no_unit_takes_part_more_often_than_its_samplers_cap(kind):
    population, cohort, rounds, groups = 60, 6, 30, 3
    sampler = make_sampler(kind, population, cohort, KEY, groups=groups)
    counts = np.zeros(population, dtype=np.int64)
    for t in range(rounds):
        counts[sampler.sample(t)] += 1
    cap = sampler.participation_cap(rounds)
    assert counts.max() <= cap
    # the cap is the rule's, not a loose bound: the separated and binned samplers reach it
    if kind in ("cyclic", "balls_in_bins", "b_min_sep", "cyclic_poisson"):
        assert cap == -(-rounds // {"cyclic": population // cohort, "balls_in_bins": population // cohort,
                                     "b_min_sep": groups, "cyclic_poisson": groups}[kind])
    if kind in ("cyclic", "balls_in_bins"):
        assert counts.max() == cap


def test_the_lines_state_the_expected_and_the_most_and_warn_where_the_rule_differs_from_the_ask():
    lines = participation_lines(make_sampler("poisson", 40, 8, None), 50, 8)
    assert lines == ["participations: 8 of 40 units a round over 50 rounds: each unit takes part in 10 rounds on "
                     "average, at most 50 under sampling=poisson"]
    binned = participation_lines(make_sampler("balls_in_bins", 40, 12, None), 6, 12)
    assert binned[1] == ("warning: sampling=balls_in_bins gives an expected cohort of 13.33, not cohort_size=12 "
                         "(40 units in 3 bins)")
    cyclic = participation_lines(make_sampler("cyclic", 40, 12, None), 6, 12)
    assert cyclic[1] == "warning: sampling=cyclic cuts 40 units into blocks of 12: the 4 left over never take part"
    assert len(participation_lines(make_sampler("cyclic", 40, 8, None), 6, 8)) == 1  # 40 = 5 x 8: nobody left out
