"""`reprogate serve`: the production model over HTTP (FastAPI on uvicorn).

POST /predict  {"text": "..."} or {"texts": ["...", ...]} -> {"predictions": [Prediction, ...]}
POST /generate {"prompt": "...", "max_tokens": N, "seed": S} -> a continuation (a language model's
               project, lm/: its production model is a causal_lm)
GET  /healthz  liveness and the model being served
GET  /version  production model, data hash, code commit, calibration
GET  /openapi.json, /docs

The model is loaded and warmed once at start-up. A watcher thread re-reads
models/production.json; when a promotion or a rollback changes it, the new model is loaded
and warmed beside the old one, then swapped in with one reference assignment: requests
already running finish on the model they started with, none is dropped. A user mistake in a
request is a 4xx with a message, never a 500, and the server keeps answering.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import socket
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from reprogate.folder.manifest import damaged
from reprogate.pipeline.kinds import KINDS, Kind
from reprogate.predict.lm import LoadedLm
from reprogate.predict.production import production_sha256
from reprogate.records.base import load as load_record
from reprogate.records.train import ModelConfig
from reprogate.serve import admission
from reprogate.serve import limits as serve_limits
from reprogate.serve.batching import Busy, MicroBatcher
from reprogate.serve.schema import (
    MAX_BATCH,
    MAX_BODY_BYTES,
    MAX_TEXT_CHARS,
    ErrorResponse,
    Generated,
    GenerateRequest,
    PredictRequest,
    PredictResponse,
)
from reprogate.serve.version import describe, say_unverified
from reprogate.specs.family import family, load_object
from reprogate.specs.pipeline import pipeline_kind
from reprogate.utils.errors import UserError, relative

__all__ = ["MAX_BATCH", "MAX_BODY_BYTES", "MAX_TEXT_CHARS", "create_app", "serve"]
log = logging.getLogger("reprogate.serve.app")


def load(root: Path, model_dir: Path | None = None, device: str = "auto"):
    """What this project serves: its production language model (a project on a text corpus, or
    a language-model folder), else its classifier."""
    return load_object(_kind(root, model_dir).serves)(root, model_dir, device)


def _kind(root: Path, model_dir: Path | None) -> Kind:
    """The kind of the folder asked for (its config's family), else the project's."""
    config = model_dir / "config.json" if model_dir is not None else None
    if config is None or not config.is_file():
        return KINDS[pipeline_kind(root)]  # no folder, or none there: the loader says what is missing
    return KINDS[family(load_record(config, ModelConfig, damaged(model_dir)).family).kind]


class Holder:
    """The model being served, and the watcher that swaps in a newly promoted one."""

    def __init__(self, root: Path, model_dir: Path | None, interval: float, device: str = "auto"):
        self.root, self.model_dir, self.interval, self.device = root, model_dir, interval, device
        self.current = load(root, model_dir, device)
        say_unverified(self.current)
        self.reload_error: str | None = None
        self.reloads = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """Reload when production.json changed; True when a new model was swapped in."""
        sha = production_sha256(self.root)
        if sha is None:
            return False
        if sha == self.current.source_sha256:
            self.reload_error = None  # the record is back to the one being served
            return False
        try:
            fresh = load(self.root, device=self.device)
        except Exception as e:  # keep serving the old model; say why on /healthz
            self.reload_error = f"{type(e).__name__}: {relative(str(e), self.root)}"
            log.error("reload failed, still serving %s: %s", self.current.version, self.reload_error)
            return False
        self.current, self.reload_error = fresh, None  # one assignment: atomic for readers
        self.reloads += 1
        # The old model sits in reference cycles (torch and transformers modules hold them), which
        # only a full collection frees, and one rarely comes on its own in a process this size:
        # without this every reload kept its predecessor (~70 MB each for the default ensemble).
        # Requests still using it hold their own reference; it goes when they finish.
        gc.collect()
        device = fresh.scorer.device if hasattr(fresh, "scorer") else fresh.device  # a classifier, an LM
        if device.type == "cuda":  # and the allocator's cache of its blocks with it
            import torch

            torch.cuda.empty_cache()
        log.info("now serving %s", fresh.version)
        say_unverified(fresh)
        return True

    def start(self) -> None:
        if self.model_dir is not None:
            return  # a fixed model folder is not watched

        def loop() -> None:
            while not self._stop.wait(self.interval):
                try:
                    self.check()
                except OSError as e:  # out of files for a moment, say: keep watching, say why
                    self.reload_error = f"could not read models/production.json ({e.strerror or e})"
                    log.error(
                        "production watcher: %s; still serving %s", self.reload_error, self.current.version
                    )

        self._thread = threading.Thread(target=loop, name="production-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)


class BodyLimit:
    """413 for a request body over `limit` bytes, whether declared (Content-Length) or sent in
    chunks without one: the body is read here, at most `limit` bytes of it, and handed on."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._refuse(scope, receive, send)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send) -> None:
        message = (
            f"request body over {self.limit} bytes; send at most {MAX_BATCH} queries of at most "
            f"{MAX_TEXT_CHARS} characters"
        )
        await _error(413, message)(scope, receive, send)


async def _predicted(batcher: MicroBatcher, loaded: Any, texts: list[str], request: Request, bounds) -> Any:
    """/predict's answer: refused past the cost bounds, 503 when the queue is full, and dropped
    when the client hangs up before it (serve/admission.py, serve/batching.py)."""
    try:
        # Off the event loop: 64 long texts take milliseconds to cut, which /healthz and the
        # other clients' bytes should not wait behind.
        cost = await asyncio.to_thread(admission.rows, texts, loaded.policy.two_requests is not None, bounds)
    except admission.Refused as e:
        return _error(e.status, str(e))
    work = asyncio.ensure_future(batcher.predict(loaded, texts, cost))
    left = asyncio.ensure_future(admission.client_left(request.receive))
    await asyncio.wait({work, left}, return_when=asyncio.FIRST_COMPLETED)
    left.cancel()
    if not work.done():  # nobody is waiting for it: the batcher drops it before its turn
        work.cancel()
        return _error(499, "the client closed the connection before the answer")
    try:
        return {"predictions": work.result()}
    except Busy as e:
        headers = {"Retry-After": str(e.retry_after_s)}
        return JSONResponse(status_code=503, content={"error": str(e), "details": []}, headers=headers)


def _error(status: int, message: str, details: list | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message, "details": details or []})


def _error_handlers(app: FastAPI) -> None:
    """A request FastAPI refuses is a 4xx naming what to send, never its default body."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        details = [{"field": ".".join(str(x) for x in e["loc"]), "message": e["msg"]} for e in exc.errors()]
        kinds = {e["type"] for e in exc.errors()}
        message = (
            "body is not valid JSON in UTF-8"
            if "json_invalid" in kinds
            else 'invalid request: send {"prompt": "...", "max_tokens": 200, "seed": 0}'
            if request.url.path == "/generate"
            else 'invalid request: send {"text": "..."} or {"texts": ["...", ...]}'
        )
        return _error(422, message, details)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400:  # FastAPI could not decode the body at all
            return _error(400, 'body is not valid JSON in UTF-8; send {"text": "..."}')
        return _error(exc.status_code, str(exc.detail))


def create_app(
    root: Path,
    model_dir: Path | None = None,
    watch_interval: float = 1.0,
    device: str = "auto",
    batching: tuple[int, float] = (MAX_BATCH, 0.002),
    limits: serve_limits.Limits | None = None,
) -> FastAPI:
    """`batching`: (most texts, longest wait in seconds) of a micro-batch of /predict requests;
    `limits`: what a request may cost and how many rows may wait (serve/limits.py)."""
    limits = limits or serve_limits.Limits()
    # Loaded here, before the server listens: a broken model is a clear error at start-up.
    holder = {"h": Holder(root, model_dir, watch_interval, device)}
    batcher = MicroBatcher(*batching, max_queued_rows=limits.max_queued_rows)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        holder["h"].start()
        yield
        holder["h"].stop()
        batcher.stop()

    about = "Routed intent predictions from the production model."
    app = FastAPI(title="reprogate", version="1", description=about, lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    _error_handlers(app)
    app.state.holder = holder["h"]
    responses = {413: {"model": ErrorResponse}, 422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}}

    @app.post("/predict", response_model=PredictResponse, responses=responses)
    async def predict(req: PredictRequest, request: Request) -> Any:
        loaded = holder["h"].current  # this request's model, even if a swap happens meanwhile
        if isinstance(loaded, LoadedLm):
            return _error(409, f"this server holds the language model {loaded.version}: POST /generate")
        texts = [req.text] if req.text is not None else req.texts
        return await _predicted(batcher, loaded, texts, request, limits.admit)

    @app.post("/generate", response_model=Generated, responses=responses)
    def generate(req: GenerateRequest) -> Any:
        loaded = holder["h"].current
        if not isinstance(loaded, LoadedLm):
            return _error(409, f"this server holds the classifier {loaded.version}: POST /predict")
        try:
            return loaded.generate(req.prompt, req.max_tokens, req.seed, req.temperature, req.top_k)
        except UserError as e:  # a prompt the vocabulary cannot spell
            return _error(422, str(e))

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        h = holder["h"]
        return {
            "status": "ok",
            "model_version": h.current.version,
            "reloads": h.reloads,
            "reload_error": h.reload_error,
            **batcher.health(),
        }

    @app.get("/version")
    def version() -> dict[str, Any]:
        return describe(holder["h"].current, holder["h"].root)

    return app


def _check_address(host: str, port: int) -> None:
    """Fail before loading the model when the address cannot be served (uvicorn would load it,
    then log the bind error and exit 3)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(
            f"--host {host}: not an address of this machine ({e.strerror}); use e.g. 127.0.0.1."
        ) from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(address)
        except OSError as e:
            fix = (
                "another server is using the port: stop it, or choose another with --port"
                if e.errno == errno.EADDRINUSE
                else "give an address of this machine (127.0.0.1; 0.0.0.0 for all) and a port over 1023"
            )
            said = f"--host {host} --port {port}: cannot listen there ({e.strerror})"
            raise UserError(f"{said}; {fix}.") from None


def serve(
    root: Path,
    host: str,
    port: int,
    model_dir: Path | None,
    device: str = "auto",
    limits: serve_limits.Limits | None = None,
) -> None:
    limits = limits or serve_limits.Limits()
    import uvicorn

    _check_address(host, port)
    cap = limits.max_connections or serve_limits.default_max_connections()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = uvicorn.Config(
        create_app(
            root,
            model_dir,
            watch_interval=limits.watch_interval,
            device=device,
            batching=(limits.max_batch, limits.batch_wait_ms / 1000),
            limits=limits,
        ),
        host=host,
        port=port,
        log_level="info",
        http=serve_limits.protocol(limits.header_timeout, cap, limits.body_timeout),
        # Accepted per wake-up of the listening socket: small, so connections are counted (and
        # the cap enforced) between batches, never past the file limit in one.
        backlog=serve_limits.ACCEPT_BATCH,
    )
    serve_limits.limit_logs()
    server = uvicorn.Server(config)

    async def run() -> None:
        asyncio.get_running_loop().set_exception_handler(serve_limits.loop_errors)
        await server.serve()

    asyncio.run(run())
