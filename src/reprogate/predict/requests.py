"""Requests no single intent answers: two requests in one, and ambiguous ones.

Both rules send a query to review with their reason, and both are fitted on the calibration
partition alone, each allowed to send at most a chosen share of its queries to review (gate spec
policy_fit.two_requests_max and ambiguous_max): what a rule costs in coverage is decided, not
found out later.

two_requests: the query is cut at conjunctions ("and", "also", "then", "plus", commas,
semicolons) into clauses of two words or more. When two clauses, each scored alone, name
different in-scope intents, both with calibrated probability at least the fitted confidence, the
query asks for two things, and acting on one of them would drop the other.

ambiguous: the normalised entropy of the query's calibrated probabilities is at least the fitted
level. A vague query ("something is wrong with my card") spreads the model's belief over many
intents even where its top intent clears the threshold.

too_short: the query has at most the fitted number of words. "fees", "pending" or "card please"
cannot say which of 77 intents is meant, yet a model that learnt from full sentences can be sure
of one; the level is the most words that stay within the budget on the calibration queries.

A budget needs enough calibration queries to be held at all (rows_needed): a new query is above
the highest of n calibration values with probability 1/(n + 1), so on fewer than 1/budget - 1
queries even the strictest level flags more than the budget, and calibrate leaves the rule off
and says so rather than fit a level it cannot keep.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np

# "and", "also", "then", "plus", "as well as" between words, or a comma/semicolon (with any of them).
CUT = re.compile(
    r"\s*[,;]\s*(?:and also|and then|and|also|then|plus|but)?\s+|\s+(?:and also|and then|as well as|and|also|"
    r"plus|then)\s+",
    re.IGNORECASE,
)
MIN_WORDS = 2
# The rules' names, as policies, budgets (policy_fit.<name>_max) and reasons spell them.
RULES = ("two_requests", "ambiguous", "too_short")

Scores = Callable[[list[str]], np.ndarray]  # texts -> calibrated probabilities, one row each


def clauses(text: str) -> list[str]:
    """The query's clauses of MIN_WORDS words or more; none when it has fewer than two."""
    parts = [p.strip(" ?.!") for p in CUT.split(text)]
    parts = [p for p in parts if len(p.split()) >= MIN_WORDS]
    return parts if len(parts) >= 2 else []


def two_request_strength(texts: list[str], score: Scores, oos_index: int | None) -> np.ndarray:
    """Per query: the largest, over pairs of its clauses naming different in-scope intents, of the
    pair's smaller calibrated probability (0 when no such pair). Clauses are scored in one call."""
    cut = [clauses(t) for t in texts]
    flat = [c for cs in cut for c in cs]
    strength = np.zeros(len(texts))
    if not flat:
        return strength
    probs = score(flat)
    pred, conf = probs.argmax(1), probs.max(1)
    at = 0
    for i, cs in enumerate(cut):
        idx = range(at, at + len(cs))
        at += len(cs)
        named = [(int(pred[j]), float(conf[j])) for j in idx if pred[j] != oos_index]
        pairs = [min(a[1], b[1]) for k, a in enumerate(named) for b in named[k + 1 :] if a[0] != b[0]]
        strength[i] = max(pairs, default=0.0)
    return strength


def spread(probs: np.ndarray) -> np.ndarray:
    """Entropy of each row of probabilities over its log(number of classes): 0 sure, 1 uniform."""
    p = np.clip(probs, 1e-12, 1.0)
    return -(p * np.log(p)).sum(1) / np.log(probs.shape[1])


def rows_needed(budget: float) -> float:
    """The fewest calibration queries on which a level fitted to this budget can keep it on new
    queries (module docstring); a budget of 0 is kept on none."""
    need = 1 / budget - 1 if budget > 0 else math.inf
    return need if math.isinf(need) else math.ceil(need - 1e-9)  # a tiny budget overflows to inf


def fit_level(values: np.ndarray, n: int, budget: float | None) -> float | None:
    """The lowest level whose `values >= level` count is at most budget * n (values of the rows
    the rule could send to review; others count as never flagged). None: the rule is off."""
    if budget is None:
        return None
    allowed = int(np.floor(budget * n + 1e-9))
    ranked = np.sort(values[values > 0])[::-1]
    if len(ranked) <= allowed:
        return float(np.nextafter(0.0, 1.0))  # every candidate fits in the budget
    return float(np.nextafter(ranked[allowed], np.inf))


def words(texts: list[str]) -> np.ndarray:
    return np.array([len(t.split()) for t in texts])


def fit_words(counts: np.ndarray, acted: np.ndarray, budget: float | None) -> int | None:
    """The most words at or below which queries the policy acts on are at most budget of all
    (0: none is flagged). None: the rule is off."""
    if budget is None:
        return None
    allowed, level = int(np.floor(budget * len(counts) + 1e-9)), 0
    while level < counts.max(initial=0) and int((acted & (counts <= level + 1)).sum()) <= allowed:
        level += 1
    return level


def reasons(
    texts: list[str],
    probs: np.ndarray,
    levels: dict[str, float | int | None],
    strength: np.ndarray | None,
) -> list[list[str]]:
    """Each query's reasons for review from these rules (empty when they let it through);
    `levels`: two_requests, ambiguous and too_short as a policy holds them (None: off);
    `strength`: two_request_strength of the texts, needed only when two_requests is on."""
    out: list[list[str]] = [[] for _ in texts]
    two_requests, ambiguous, few = (
        levels.get("two_requests"),
        levels.get("ambiguous"),
        levels.get("too_short"),
    )
    if two_requests is not None:
        if strength is None:
            raise ValueError("two_requests is on: pass the texts' two_request_strength")
        for i in np.flatnonzero(strength >= two_requests):
            out[i].append("two_requests")
    if ambiguous is not None:
        for i in np.flatnonzero(spread(probs) >= ambiguous):
            out[i].append("ambiguous")
    if few:
        for i in np.flatnonzero(words(texts) <= few):
            out[i].append("too_short")
    return out
