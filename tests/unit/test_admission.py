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


def test_each_bound_names_the_flag_that_moves_it_and_the_flag_moves_it():
    from reprogate.cli.main import build_parser
    from reprogate.serve.admission import Bounds
    from reprogate.serve.batching import Busy

    three = "check my balance, then freeze my card, and order a new one"
    with pytest.raises(Refused, match=r"at most 2 are \(reprogate serve --max-clauses\)"):
        rows([three], True, Bounds(clauses=2))
    assert rows([three], True, Bounds(clauses=3)) == [4]
    with pytest.raises(Refused, match=r"at most 5 are taken at once \(reprogate serve --max-request-rows\)"):
        rows(["hi there"] * 6, True, Bounds(request_rows=5))
    assert "--max-queued-rows" in str(Busy(10, 5, 12, 1))
    args = build_parser().parse_args(
        ["serve", "--max-clauses", "3", "--max-request-rows", "64", "--max-queued-rows", "99"]
    )
    assert (args.max_clauses, args.max_request_rows, args.max_queued_rows) == (3, 64, 99)
