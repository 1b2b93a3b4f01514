"""Concurrent /predict requests answered together: micro-batches with a bounded wait, a bounded
size in model rows, fair turns, a bounded queue, and no work for clients that left.

One worker thread runs the model. A request that finds the server idle (the last batch held one
request) is answered at once; under concurrency a batch stays open until it is full or
`max_wait_s` after its first request arrived, whichever comes first. A batched call costs far
less per text than one call per request (the runtime's matrix products get their rows in one go).

What a text costs is its rows: the text, plus one per clause the two-requests rule scores alone
(predict/requests.py), so 200 commas are 200 rows. A batch holds at most `max_rows` rows; a
larger request is answered over several batches. A batch is filled breadth first (each waiting
request's next text before anyone's second), so a small request waits at most one batch's work
behind any number of large ones, never the whole of them. The rows waiting in all are bounded
(`max_queued_rows`): past it a request is refused at once (Busy: the server answers 503 with
Retry-After) instead of waiting behind work it cannot catch up with. A request whose client
went away (its future was cancelled) is dropped before its next turn, and its rows leave the
queue with it.

Requests are never mixed across models: a batch is split by the model each request took when
it arrived, so a hot swap never answers a request with a model it did not start with.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

MAX_BATCH_ROWS = 256
MAX_QUEUED_ROWS = 4096


class Busy(Exception):
    """The queue holds as many rows as it may: come back later (503, Retry-After)."""

    def __init__(self, queued: int, asked: int, limit: int, retry_after_s: int):
        super().__init__(
            f"the server is busy: {queued} model rows are waiting and this request adds {asked}, "
            f"over the limit of {limit} (reprogate serve --max-queued-rows); retry in {retry_after_s} s, or "
            "send fewer or shorter queries"
        )
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Pending:
    model: Any  # what the request took from the holder (its .predict(texts) answers)
    texts: list[str]
    rows: list[int]  # model rows of each text
    arrived: float
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    done: int = 0  # texts answered so far
    answers: list[dict[str, Any]] = field(default_factory=list)

    def left(self) -> int:
        return sum(self.rows[self.done :])


def _settle(p: Pending, result: Any = None, error: BaseException | None = None) -> None:
    def finish() -> None:
        if p.future.done():  # the client went away while it waited
            return
        if error is not None:
            p.future.set_exception(error)
        else:
            p.future.set_result(result)

    p.loop.call_soon_threadsafe(finish)


class MicroBatcher:
    def __init__(
        self,
        max_batch: int = 64,
        max_wait_s: float = 0.002,
        max_rows: int = MAX_BATCH_ROWS,
        max_queued_rows: int = MAX_QUEUED_ROWS,
    ):
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.max_rows, self.max_queued_rows = max_rows, max_queued_rows
        self._queue: queue.Queue[Pending | None] = queue.Queue()
        self._turns: deque[Pending] = deque()  # the worker's own: requests with texts left
        self._lock = threading.Lock()
        self._queued_rows = 0
        self._seconds_per_row = 0.005  # measured as batches are answered; sizes Retry-After
        self.batches = self.texts = self.dropped = 0  # how it has gone
        self._concurrent = False  # did the last batch hold more than one request?
        self._thread = threading.Thread(target=self._work, name="predict-batcher", daemon=True)
        self._thread.start()

    async def predict(self, model: Any, texts: list[str], rows: list[int] | None = None) -> list[dict]:
        """The answers to `texts`, each text costing its `rows` (default one)."""
        rows = rows or [1] * len(texts)
        with self._lock:
            if self._queued_rows and self._queued_rows + sum(rows) > self.max_queued_rows:
                wait = max(1, round(self._queued_rows * self._seconds_per_row + 0.5))
                raise Busy(self._queued_rows, sum(rows), self.max_queued_rows, wait)
            self._queued_rows += sum(rows)
        loop = asyncio.get_running_loop()
        pending = Pending(model, texts, rows, time.perf_counter(), loop.create_future(), loop)
        self._queue.put(pending)
        # Cancelled (the client left): the future is cancelled with this coroutine, and the
        # worker drops the request before its next turn.
        return await pending.future

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def health(self) -> dict[str, int]:
        """For /healthz: rows waiting, and requests dropped because their clients left."""
        return {"queued_rows": self._queued_rows, "dropped": self.dropped}

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _release(self, rows: int) -> None:
        with self._lock:
            self._queued_rows -= rows

    def _arrivals(self) -> bool:
        """New requests into the turns: wait for one when there are none (False: stop), and under
        concurrency keep the batch open for company until max_wait_s after the first arrived."""
        if not self._turns:
            first = self._queue.get()
            if first is None:
                return False
            self._turns.append(first)
        deadline = self._turns[0].arrived + (self.max_wait_s if self._concurrent else 0.0)
        while True:  # everything that arrived joins the line; waiting only while rows are short
            try:
                wait = deadline - time.perf_counter()
                short = sum(p.left() for p in self._turns) < self.max_rows
                nxt = self._queue.get(timeout=wait) if wait > 0 and short else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._queue.put(None)  # seen again by the loop, after the work in hand
                break
            self._turns.append(nxt)
        return True

    def _take(self) -> list[tuple[Pending, int, int]]:
        """One batch, filled breadth first: every waiting request gives its next text before any
        gives a second, so one small request waits for at most one batch however many large
        ones are ahead of it (in turns of whole requests, 8 clients of 64 long texts each put
        8 batches before it). Those with texts left go to the back of the line. Requests whose
        clients left are dropped here."""
        live = []
        for p in list(self._turns):
            if p.future.cancelled():
                self._turns.remove(p)
                self._release(p.left())
                self.dropped += 1
            else:
                live.append(p)
        ends = {id(p): p.done for p in live}
        rows = texts = 0
        grew = True
        while grew and texts < self.max_batch and rows < self.max_rows:
            grew = False
            for p in live:
                end = ends[id(p)]
                if end >= len(p.texts) or (texts and rows + p.rows[end] > self.max_rows):
                    continue  # (the batch's first text always goes)
                ends[id(p)], rows, texts, grew = end + 1, rows + p.rows[end], texts + 1, True
                if texts >= self.max_batch or rows >= self.max_rows:
                    break
        batch = [(p, p.done, ends[id(p)]) for p in live if ends[id(p)] > p.done]
        for p, _, _ in batch:
            self._turns.remove(p)
        self._concurrent = len(batch) > 1
        return batch

    def _work(self) -> None:
        while self._arrivals():
            self._serve(self._take())

    def _serve(self, batch: list[tuple[Pending, int, int]]) -> None:
        """A method of its own so that nothing of a finished batch (a request, a model) stays
        referenced while the worker waits: after a hot swap, the old model must be freed when
        its last request is answered."""
        for model in {id(p.model): p.model for p, _, _ in batch}.values():
            self._answer(model, [b for b in batch if b[0].model is model])
        for p, _, _ in batch:
            if p.done < len(p.texts):
                self._turns.append(p)  # the rest at its next turn, behind the others

    def _answer(self, model: Any, group: list[tuple[Pending, int, int]]) -> None:
        texts = [t for p, a, b in group for t in p.texts[a:b]]
        rows = sum(sum(p.rows[a:b]) for p, a, b in group)
        started = time.perf_counter()
        try:
            predictions = model.predict(texts)
        except Exception as e:  # every request of the batch hears of it; the worker goes on
            for p, _, _ in group:
                self._release(p.left())
                p.done = len(p.texts)
                _settle(p, error=e)
            return
        done = time.perf_counter()
        self._seconds_per_row = (done - started) / max(rows, 1)
        self.batches, self.texts = self.batches + 1, self.texts + len(texts)
        self._release(rows)
        start = 0
        for p, a, b in group:
            p.answers += predictions[start : start + b - a]
            start += b - a
            p.done = b
            if b == len(p.texts):
                # A request's latency is its own: the wait for its turns and their model calls.
                ms = round((done - p.arrived) * 1000, 3)
                _settle(p, [dict(x, latency_ms=ms) for x in p.answers])
