"""The one call to `reprogate serve`: POST /predict, never blocking the event loop.

Every way the call can go wrong (no answer in time, nothing listening, an HTTP error, a body
that is not a prediction) comes back as a Failure with a sentence to say, never as an
exception: Home Assistant's log only ever sees a warning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import aiohttp

from .const import MAX_RESPONSE_BYTES, MAX_TEXT_CHARS


@dataclass(frozen=True)
class Answer:
    intent: str
    probability: float
    route: str  # "act" or "review"
    reasons: list[str]
    alternatives: list[tuple[str, float]]
    model_version: str
    latency_ms: float | None = None
    truncated: bool = False


@dataclass(frozen=True)
class Failure:
    say: str  # what the assistant answers
    log: str  # what goes to Home Assistant's log, as a warning
    details: dict = field(default_factory=dict)


class TooLarge(Exception):
    """A response body past MAX_RESPONSE_BYTES: left unread."""


async def read_bounded(resp: aiohttp.ClientResponse) -> bytes:
    """The body, or TooLarge as soon as it passes MAX_RESPONSE_BYTES (declared or streamed)."""
    if resp.content_length is not None and resp.content_length > MAX_RESPONSE_BYTES:
        raise TooLarge(f"it declared {resp.content_length} bytes")
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(16 * 1024):
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise TooLarge(f"it sent more than {MAX_RESPONSE_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def get_json(session: aiohttp.ClientSession, url: str, timeout: float) -> object:
    """GET `url` as JSON, bounded in time and size; raises aiohttp.ClientError, TimeoutError,
    TooLarge or ValueError."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        if resp.status != 200:
            raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
        return json.loads(await read_bounded(resp))


async def vocabulary(session: aiohttp.ClientSession, url: str, timeout: float) -> list[str] | None:
    """The intents the served model may act on (GET /version), or None when not available."""
    try:
        version = await get_json(session, f"{url.rstrip('/')}/version", timeout)
    except (aiohttp.ClientError, TimeoutError, TooLarge, ValueError, RecursionError):
        return None
    intents = version.get("intents") if isinstance(version, dict) else None
    if not isinstance(intents, list) or not all(isinstance(x, str) and len(x) <= 100 for x in intents):
        return None
    return intents[:1000]


async def predict(session: aiohttp.ClientSession, url: str, text: str, timeout: float) -> Answer | Failure:
    truncated = len(text) > MAX_TEXT_CHARS
    body = {"text": text[:MAX_TEXT_CHARS]}
    where = f"{url.rstrip('/')}/predict"
    try:
        async with session.post(where, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                detail = (await resp.content.read(300)).decode("utf-8", "replace")
                return Failure(
                    f"reprogate refused the request (HTTP {resp.status}), so I did nothing.",
                    f"reprogate at {where} answered HTTP {resp.status}: {detail}",
                    {"status": resp.status},
                )
            payload = json.loads(await read_bounded(resp))
    except TooLarge as e:
        return Failure(
            "reprogate answered far more than a prediction, so I did nothing.",
            f"reprogate at {where} answered a body too large to be a prediction ({e}); refused unread",
        )
    except TimeoutError:
        return Failure(
            f"reprogate did not answer within {timeout:g} seconds, so I did nothing.",
            f"reprogate at {where} did not answer within {timeout:g} s; raise the timeout in the "
            "integration's options or check the server",
        )
    except aiohttp.ClientError as e:
        return Failure(
            "reprogate could not be reached, so I did nothing.",
            f"reprogate at {where} could not be reached ({type(e).__name__}: {e}); is `reprogate "
            "serve` running there?",
        )
    except (ValueError, RecursionError) as e:  # the body was not JSON, or nested past Python's depth
        return Failure(
            "reprogate answered something I cannot read, so I did nothing.",
            f"reprogate at {where} answered a body that is not JSON ({e})",
        )
    return _answer(payload, where, truncated)


def _answer(payload: object, where: str, truncated: bool) -> Answer | Failure:
    try:
        p = payload["predictions"][0]  # type: ignore[index]
        answer = Answer(
            intent=str(p["intent"]),
            probability=float(p["probability"]),
            route=str(p["route"]),
            reasons=[str(r) for r in p["reasons"]],
            alternatives=[(str(a["intent"]), float(a["probability"])) for a in p["alternatives"]],
            model_version=str(p["model_version"]),
            latency_ms=float(p["latency_ms"]) if p.get("latency_ms") is not None else None,
            truncated=truncated,
        )
        if not 0.0 <= answer.probability <= 1.0 or not all(0.0 <= q <= 1.0 for _, q in answer.alternatives):
            raise ValueError("a probability outside [0, 1]")
        return answer
    except (KeyError, IndexError, TypeError, ValueError, OverflowError) as e:
        return Failure(
            "reprogate answered something I cannot read, so I did nothing.",
            f"reprogate at {where} answered JSON without a prediction ({type(e).__name__}: {e}); "
            "is the URL a reprogate server of a matching version?",
        )
