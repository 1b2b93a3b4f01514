"""Concurrent /predict requests answered together: micro-batches with a bounded wait.

The first request to arrive opens a batch; it closes when it holds `max_batch` texts or
`max_wait_s` after it opened, whichever comes first, and one worker thread runs the model once
on all of it. Under load a batched call costs far less per text than one call per request (the
runtime's matrix products get their rows in one go); alone, a request waits at most max_wait_s.
Requests are never mixed across models: a batch is split by the model each request took when
it arrived, so a hot swap never answers a request with a model it did not start with.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Pending:
    model: Any  # what the request took from the holder (its .predict(texts) answers)
    texts: list[str]
    arrived: float
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


def _settle(p: Pending, result: Any = None, error: BaseException | None = None) -> None:
    def done() -> None:
        if p.future.cancelled():  # the client went away while it waited
            return
        if error is not None:
            p.future.set_exception(error)
        else:
            p.future.set_result(result)

    p.loop.call_soon_threadsafe(done)


class MicroBatcher:
    def __init__(self, max_batch: int = 64, max_wait_s: float = 0.002):
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self._queue: queue.Queue[Pending | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="predict-batcher", daemon=True)
        self._thread.start()
        self.batches = self.texts = 0  # how it has gone, for /healthz

    async def predict(self, model: Any, texts: list[str]) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        pending = Pending(model, texts, time.perf_counter(), loop.create_future(), loop)
        self._queue.put(pending)
        return await pending.future

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _collect(self, first: Pending) -> list[Pending]:
        """`first` and whatever joins it before the batch is full or its wait is over (a stop()
        meanwhile ends the wait; the batch is still answered)."""
        batch, size = [first], len(first.texts)
        deadline = first.arrived + self.max_wait_s
        while size < self.max_batch:
            try:
                nxt = self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                break
            if nxt is None:
                self._queue.put(None)  # seen again by the loop, after this batch
                break
            batch.append(nxt)
            size += len(nxt.texts)
        return batch

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            self._batch(first)
            # Nothing of a finished batch stays referenced while the worker waits: after a hot
            # swap, the old model must be freed when its last request is answered.
            del first

    def _batch(self, first: Pending) -> None:
        batch = self._collect(first)
        for model in {id(p.model): p.model for p in batch}.values():
            self._answer(model, [p for p in batch if p.model is model])

    def _answer(self, model: Any, group: list[Pending]) -> None:
        texts = [t for p in group for t in p.texts]
        try:
            predictions = model.predict(texts)
        except Exception as e:  # every request of the batch hears of it; the worker goes on
            for p in group:
                _settle(p, error=e)
            return
        done = time.perf_counter()
        self.batches, self.texts = self.batches + 1, self.texts + len(texts)
        start = 0
        for p in group:
            mine = predictions[start : start + len(p.texts)]
            start += len(p.texts)
            # A request's latency is its own: the wait for its batch and the batch's model call.
            ms = round((done - p.arrived) * 1000, 3)
            _settle(p, [dict(x, latency_ms=ms) for x in mine])
