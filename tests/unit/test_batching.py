"""Micro-batching of /predict: concurrent requests share model calls, each gets its own answers
in its own order, a request alone waits no longer than the bound, requests that took different
models (a hot swap) are never answered by one call, and a failing call fails only its batch."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from reprogate.serve.batching import Busy, MicroBatcher


class Model:
    def __init__(self, tag: str, delay: float = 0.0, fail: bool = False):
        self.tag, self.delay, self.fail = tag, delay, fail
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()

    def predict(self, texts: list[str]) -> list[dict]:
        with self.lock:
            self.calls.append(list(texts))
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("the model broke")
        return [{"text": t, "by": self.tag, "latency_ms": -1.0} for t in texts]


def _run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_share_calls_and_get_their_own_answers():
    model = Model("a", delay=0.01)
    batcher = MicroBatcher(max_batch=64, max_wait_s=0.05)

    async def many():
        return await asyncio.gather(*(batcher.predict(model, [f"q{i}", f"r{i}"]) for i in range(20)))

    answers = _run(many())
    batcher.stop()
    assert [[p["text"] for p in a] for a in answers] == [[f"q{i}", f"r{i}"] for i in range(20)]
    assert len(model.calls) < 20 and sum(len(c) for c in model.calls) == 40
    assert all(len(c) <= 64 + 1 for c in model.calls)
    # A request's latency is its own wait plus its batch's call, never the model's placeholder.
    assert all(p["latency_ms"] >= 0 for a in answers for p in a)


def test_a_request_that_finds_the_server_idle_is_answered_at_once():
    model = Model("a")
    batcher = MicroBatcher(max_batch=64, max_wait_s=2.0)
    for text in ("one", "two"):
        start = time.perf_counter()
        (answer,) = _run(batcher.predict(model, [text]))
        assert answer["text"] == text and time.perf_counter() - start < 1.0
    batcher.stop()
    assert model.calls == [["one"], ["two"]]


def test_under_concurrency_a_batch_waits_at_most_the_bound():
    model = Model("a", delay=0.05)
    batcher = MicroBatcher(max_batch=1000, max_wait_s=0.3)

    async def waves():
        await asyncio.gather(*(batcher.predict(model, [f"a{i}"]) for i in range(8)))  # now concurrent
        start = time.perf_counter()
        await batcher.predict(model, ["late"])  # waits for company, then goes alone
        return time.perf_counter() - start

    took = _run(waves())
    batcher.stop()
    assert 0.3 <= took < 2.0 and model.calls[-1] == ["late"]


def test_a_full_batch_does_not_wait():
    model = Model("a")
    batcher = MicroBatcher(max_batch=4, max_wait_s=5.0)
    start = time.perf_counter()
    _run(batcher.predict(model, ["1", "2", "3", "4"]))
    batcher.stop()
    assert time.perf_counter() - start < 2.0


def test_requests_that_took_different_models_are_never_answered_by_one_call():
    old, new = Model("old"), Model("new")
    batcher = MicroBatcher(max_batch=64, max_wait_s=0.05)

    async def mixed():
        return await asyncio.gather(*(batcher.predict(old if i % 2 else new, [f"q{i}"]) for i in range(10)))

    answers = _run(mixed())
    batcher.stop()
    assert [a[0]["by"] for a in answers] == ["new" if i % 2 == 0 else "old" for i in range(10)]
    assert all(t in {f"q{i}" for i in range(1, 10, 2)} for c in old.calls for t in c)
    assert all(t in {f"q{i}" for i in range(0, 10, 2)} for c in new.calls for t in c)


def test_a_failing_call_fails_its_requests_and_the_batcher_goes_on():
    batcher = MicroBatcher(max_batch=64, max_wait_s=0.01)
    with pytest.raises(RuntimeError, match="the model broke"):
        _run(batcher.predict(Model("bad", fail=True), ["x"]))
    assert _run(batcher.predict(Model("good"), ["y"]))[0]["by"] == "good"
    batcher.stop()


def test_a_large_request_takes_turns_so_a_small_one_waits_one_batch_not_all_of_it():
    model = Model("a", delay=0.05)
    batcher = MicroBatcher(max_batch=64, max_wait_s=0.01, max_rows=40)
    finished: dict[str, float] = {}

    async def timed(name: str, texts: list[str], rows: list[int]):
        answers = await batcher.predict(model, texts, rows)
        finished[name] = time.perf_counter()
        return answers

    async def both():
        big = asyncio.ensure_future(timed("big", [f"b{i}" for i in range(40)], [10] * 40))  # 10 batches
        await asyncio.sleep(0.02)
        start = time.perf_counter()
        small = await timed("small", ["s"], [1])
        return start, small, await big

    start, small, big = _run(both())
    batcher.stop()
    assert small[0]["text"] == "s" and [p["text"] for p in big] == [f"b{i}" for i in range(40)]
    assert finished["small"] < finished["big"]
    assert finished["small"] - start < 0.4  # one or two of the big request's batches, not ten
    assert all(sum(10 if t.startswith("b") else 1 for t in c) <= 40 for c in model.calls)


def test_past_the_queued_rows_a_request_is_refused_at_once_with_a_retry_time():
    model = Model("a", delay=0.3)
    batcher = MicroBatcher(max_batch=64, max_wait_s=0.0, max_rows=8, max_queued_rows=16)

    async def flood():
        first = asyncio.ensure_future(batcher.predict(model, ["x"] * 12, [1] * 12))
        await asyncio.sleep(0.05)
        with pytest.raises(Busy) as e:
            await batcher.predict(model, ["y"] * 8, [1] * 8)
        await first
        return e.value

    busy = _run(flood())
    assert busy.retry_after_s >= 1 and "12 model rows are waiting" in str(busy) and "retry in" in str(busy)
    assert batcher.queued_rows == 0
    batcher.stop()


def test_work_for_a_client_that_left_is_never_done():
    model = Model("a", delay=0.2)
    batcher = MicroBatcher(max_batch=64, max_wait_s=0.0)

    async def leave():
        first = asyncio.ensure_future(batcher.predict(model, ["keep"]))
        await asyncio.sleep(0.05)  # the worker is busy with "keep"
        gone = asyncio.ensure_future(batcher.predict(model, ["gone"] * 5))
        await asyncio.sleep(0.01)
        gone.cancel()  # what the server does when the client hangs up
        await first
        await asyncio.sleep(0.3)

    _run(leave())
    batcher.stop()
    assert model.calls == [["keep"]] and batcher.dropped == 1 and batcher.queued_rows == 0


def test_a_small_request_waits_one_batch_however_many_large_ones_are_ahead():
    # Eight clients of 64 texts each, then a one-text client: in turns of whole requests it
    # waited behind eight full batches; filled breadth first, it is in the next batch.
    model = Model("a", delay=0.1)
    batcher = MicroBatcher(max_batch=64, max_wait_s=0.01)
    finished: dict[str, float] = {}

    async def timed(name: str, texts: list[str]):
        answers = await batcher.predict(model, texts)
        finished[name] = time.perf_counter()
        return answers

    async def all_of_them():
        first = asyncio.ensure_future(timed("warm", ["w"]))  # the worker busy while the line forms
        heavy = [asyncio.ensure_future(timed(f"h{k}", [f"h{k}.{i}" for i in range(64)])) for k in range(8)]
        await asyncio.sleep(0.02)
        start = time.perf_counter()
        small = await timed("small", ["s"])
        return start, small, await asyncio.gather(first, *heavy)

    start, small, heavy = _run(all_of_them())
    batcher.stop()
    assert small[0]["text"] == "s" and all(len(h) in (1, 64) for h in heavy)
    assert finished["small"] - start < 0.45  # the batch in hand and the next: not eight
    assert all(len(c) <= 64 for c in model.calls)
