"""What a /predict request may cost (serve/admission.py): clauses per text and rows per request
are bounded before anything waits, and a long text with a few real clauses is still answered."""

from __future__ import annotations

import pytest

from reprogate.serve.admission import MAX_CLAUSES, MAX_REQUEST_ROWS, Refused, rows


def test_a_long_text_with_three_real_clauses_costs_four_rows():
    text = (
        "my card was declined at the supermarket this morning even though there is money on it, "
        "and also I want to know why the exchange rate on my last transfer was so poor, "
        "then please tell me how to order a new card "
    )
    text = (text * 8)[:1000]
    assert len(text) == 1000
    (cost,) = rows([text], scores_clauses=True)
    assert 2 <= cost <= MAX_CLAUSES + 1
    assert rows(["my card never arrived"], scores_clauses=True) == [1]
    assert rows(["a b, " * 200], scores_clauses=False) == [1]  # no clause rule, no clause rows


def test_a_text_of_hundreds_of_clauses_is_refused_with_the_numbers_and_the_fix():
    with pytest.raises(Refused) as e:
        rows(["fine", "a b, " * 200], scores_clauses=True)
    said = str(e.value)
    assert e.value.status == 422 and "query 1 has 200 clauses" in said and f"at most {MAX_CLAUSES}" in said
    assert "separate queries" in said


def test_a_request_over_the_row_budget_is_refused():
    text = ", ".join(f"word{i} more{i}" for i in range(MAX_CLAUSES))  # MAX_CLAUSES clauses: allowed
    per = rows([text], scores_clauses=True)[0]
    assert per == MAX_CLAUSES + 1
    n = MAX_REQUEST_ROWS // per + 1
    with pytest.raises(Refused) as e:
        rows([text] * n, scores_clauses=True)
    assert f"costs {n * per} model rows" in str(e.value) and "fewer queries" in str(e.value)


def test_counting_clauses_is_linear_in_the_text_so_the_event_loop_is_never_held():
    # `" " * 999 + "x"` took the raw cut about 60 ms (a quadratic regex over a whitespace run),
    # and admission runs in the server's event loop: 64 such texts held /healthz for seconds.
    import time

    from reprogate.serve import admission

    texts = [" " * 999 + "x"] * 64 + [", " * 499 + "x"] * 64 + ["a " + "\t" * 997 + "b"] * 64
    started = time.perf_counter()
    assert admission.rows(texts, scores_clauses=True) == [1] * len(texts)
    assert time.perf_counter() - started < 0.25
