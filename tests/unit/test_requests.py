"""The request rules: two requests in one and ambiguous queries go to review, each rule held to
the share of calibration queries its budget allows."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from reprogate.predict import requests
from reprogate.predict.calibration import Policy, act_mask, prediction

LABELS = ["freeze_card", "new_card", "balance", "out_of_scope"]
WORDS = {"freeze": 0, "block": 0, "new": 1, "replacement": 1, "balance": 2, "weather": 3}


def keyword_scores(texts: list[str]) -> np.ndarray:
    """Probabilities from the words a text has (a fixed, readable model of four classes)."""
    out = np.full((len(texts), len(LABELS)), 0.05)
    for i, t in enumerate(texts):
        for w in t.lower().split():
            if w in WORDS:
                out[i, WORDS[w]] += 1.0
    return out / out.sum(1, keepdims=True)


def test_clauses_are_cut_at_conjunctions_and_keep_two_words_or_more():
    assert requests.clauses("freeze my card and send me a new one") == ["freeze my card", "send me a new one"]
    said = requests.clauses("block my card, also what is my balance?")
    assert said == ["block my card", "what is my balance"]
    assert requests.clauses("what is my balance") == []
    assert requests.clauses("card and pin") == []  # one-word parts are not requests


def test_two_clauses_naming_two_intents_are_two_requests_and_one_intent_is_not():
    texts = ["freeze my card and send a new card", "freeze my card and block it now", "what is my balance"]
    strength = requests.two_request_strength(texts, keyword_scores, oos_index=3)
    assert strength[0] > 0.5 and strength[1] == 0.0 and strength[2] == 0.0
    weather = requests.two_request_strength(["freeze my card and the weather today"], keyword_scores, 3)
    assert weather[0] == 0.0  # an out-of-scope clause names no intent


def test_reasons_reach_the_route_and_the_prediction():
    texts = ["freeze my card and send a new card", "freeze my card please"]
    probs = keyword_scores(texts)
    policy = Policy(1.0, threshold=0.3, margin=0.0, two_requests=0.5, ambiguous=None)
    strength = requests.two_request_strength(texts, keyword_scores, 3)
    extra = requests.reasons(texts, probs, {"two_requests": 0.5}, strength)
    assert extra == [["two_requests"], []]
    assert act_mask(probs, policy, 3, extra).tolist() == [False, True]
    said = prediction(probs[0], LABELS, policy, 3, extra[0])
    assert said["route"] == "review" and said["reasons"] == ["two_requests"]


def test_spread_is_zero_when_sure_and_one_when_uniform():
    assert requests.spread(np.array([[1.0, 0, 0, 0]]))[0] < 1e-9
    assert abs(requests.spread(np.full((1, 4), 0.25))[0] - 1.0) < 1e-9


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.floats(0.0, 1.0), min_size=0, max_size=60),
    extra=st.integers(0, 60),
    budget=st.floats(0.0, 1.0),
)
def test_a_fitted_level_sends_no_more_than_its_budget_and_is_the_lowest_that_does_not(values, extra, budget):
    v = np.array(values)
    n = len(values) + extra
    level = requests.fit_level(v, max(n, 1), budget)
    allowed = int(np.floor(budget * max(n, 1) + 1e-9))
    flagged = int((v[v > 0] >= level).sum())
    assert flagged <= allowed
    ranked = np.sort(v[v > 0])[::-1]
    if len(ranked) > allowed:  # one step lower would flag more than allowed
        assert int((v >= ranked[allowed]).sum()) > allowed
    assert requests.fit_level(v, max(n, 1), None) is None


@given(budget=st.floats(0.0, 1.0))
def test_rows_needed_is_the_fewest_calibration_queries_on_which_a_budget_can_be_kept(budget):
    # A new query is above the highest of n calibration values with probability 1/(n + 1).
    n = requests.rows_needed(budget)
    if budget == 0:
        assert n == float("inf")
        return
    assert 1 / (n + 1) <= budget + 1e-12
    assert n == 0 or 1 / n > budget - 1e-12


def test_a_query_of_fewer_words_than_the_fitted_level_is_too_short():
    texts = ["fees", "card please", "freeze my card now please", "what is my balance today"]
    probs = keyword_scores(texts)
    assert requests.reasons(texts, probs, {"too_short": 2}, None) == [
        ["too_short"],
        ["too_short"],
        [],
        [],
    ]
    assert requests.reasons(texts, probs, {"too_short": 0}, None) == [[], [], [], []]


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.integers(1, 12), min_size=1, max_size=80),
    acted=st.lists(st.booleans(), min_size=80, max_size=80),
    budget=st.floats(0.0, 0.2),
)
def test_the_fitted_word_level_keeps_to_its_budget_and_one_more_word_would_not(counts, acted, budget):
    c, a = np.array(counts), np.array(acted[: len(counts)])
    level = requests.fit_words(c, a, budget)
    allowed = int(np.floor(budget * len(c) + 1e-9))
    assert int((a & (c <= level)).sum()) <= allowed
    if level < c.max():
        assert int((a & (c <= level + 1)).sum()) > allowed
    assert requests.fit_words(c, a, None) is None
