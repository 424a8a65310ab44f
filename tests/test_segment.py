"""The segmenter against brute force: always feasible when brute force is, never worse than a
small measured gap, and the exact optimum on the large majority of inputs."""

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_builders.segment import objective, segment, segment_brute_force


def _blocks(sizes, cuts):
    bounds = [0, *cuts, len(sizes)]
    return [sum(sizes[a:b]) for a, b in itertools.pairwise(bounds)]


@st.composite
def problems(draw):
    n = draw(st.integers(1, 12))
    sizes = draw(st.lists(st.integers(10, 250), min_size=n, max_size=n))
    scores = draw(st.lists(st.integers(0, 3), min_size=n - 1, max_size=n - 1))
    min_tokens = draw(st.sampled_from([50, 100, 200]))
    max_tokens = draw(st.sampled_from([None, 300, 500, 800]))
    return sizes, scores, min_tokens, max_tokens


@given(problems())
@settings(max_examples=300)
def test_segmenter_is_feasible_valid_and_near_optimal(problem):
    sizes, scores, min_tokens, max_tokens = problem
    exact = segment_brute_force(sizes, scores, min_tokens, max_tokens)
    found = segment(sizes, scores, min_tokens, max_tokens)
    assert (found is None) == (exact is None)
    if found is None:
        return
    for block in _blocks(sizes, found.cuts):
        assert block >= min_tokens and (max_tokens is None or block <= max_tokens)
    assert found.objective == pytest.approx(objective(found.cuts, sizes, scores))
    assert found.objective <= exact.objective + 1e-9
    assert exact.objective - found.objective < 0.1, "the Lagrangian hull misses by at most a small margin"


def test_optimal_on_the_large_majority_of_random_inputs():
    rng = random.Random(0)
    optimal = total = 0
    for _ in range(300):
        n = rng.randint(2, 13)
        sizes = [rng.randint(20, 200) for _ in range(n)]
        scores = [rng.randint(0, 3) for _ in range(n - 1)]
        cap = rng.choice([None, 400, 600])
        exact = segment_brute_force(sizes, scores, 200, cap)
        if exact is None:
            continue
        total += 1
        optimal += segment(sizes, scores, 200, cap).objective >= exact.objective - 1e-9
    assert total > 150 and optimal / total >= 0.95


def test_zero_scores_are_avoided_unless_nothing_else_fits():
    sizes = [100] * 6
    assert 3 not in segment(sizes, [1, 1, 0, 1, 1], 200).cuts
    forced = segment([100, 100, 100, 100], [0, 0, 0], 200, 250)
    assert forced is not None and forced.cuts == (2,), "all-zero scores still segment when they must"


def test_infeasible_inputs_return_none():
    assert segment([50, 50], [3], 200) is None  # shorter than one block
    assert segment([100, 5000, 100], [3, 3], 50, 1000) is None  # one sentence over the cap
    assert segment([], [], 200) is None
    with pytest.raises(ValueError, match="boundary scores"):
        segment([100, 100], [1, 2], 50)
