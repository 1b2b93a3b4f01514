"""Concurrent /predict requests answered together: micro-batches with a bounded wait.

One worker thread runs the model; a batch is every request waiting when it is free. A request
that finds the server idle (the last batch held one request) is answered at once; under
concurrency a batch stays open until it holds `max_batch` texts or `max_wait_s` after its first
request arrived, whichever comes first. A batched call costs far less per text than one call per
request (the runtime's matrix products get their rows in one go); no request waits longer than
max_wait_s for others.
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
        self.batches = self.texts = 0  # how it has gone
        self._concurrent = False  # did the last batch hold more than one request?

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
        # Alone, no waiting: whatever queued meanwhile joins, and nothing more is awaited.
        deadline = first.arrived + (self.max_wait_s if self._concurrent else 0.0)
        while size < self.max_batch:
            try:
                wait = deadline - time.perf_counter()
                nxt = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._queue.put(None)  # seen again by the loop, after this batch
                break
            batch.append(nxt)
            size += len(nxt.texts)
        self._concurrent = len(batch) > 1
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
