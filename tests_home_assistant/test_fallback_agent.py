"""The reprogate conversation agent inside real Home Assistant, against a real `reprogate serve`.

Text goes in through Assist's own websocket API (`assist_pipeline/run`, what the frontend and
voice satellites use) on a pipeline whose conversation agent is reprogate with "prefer handling
commands locally". Actions are the intent_script entries a home would configure, each calling a
light service; the light services record their calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import statistics
import time
from pathlib import Path

import pytest
from homeassistant.components.assist_pipeline.pipeline import async_get_pipeline, async_update_pipeline
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from homeassistant.util.yaml import load_yaml_dict
from pytest_homeassistant_custom_component.common import MockConfigEntry, async_mock_service

from custom_components.reprogate.const import CONF_TIMEOUT, CONF_URL, DOMAIN
from tests_home_assistant.conftest import Server, free_port

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "home_assistant" / "configuration.yaml"
SERVICES = [("light", "turn_on"), ("light", "turn_off"), ("timer", "start"), ("media_player", "media_play")]


async def _home(hass: HomeAssistant) -> dict[str, list]:
    """Home Assistant with a kitchen light and the example's intent_script, one per intent;
    the services the scripts call record their calls."""
    calls = {f"{d}.{s}": async_mock_service(hass, d, s) for d, s in SERVICES}
    hass.states.async_set("light.kitchen", "off", {"friendly_name": "Kitchen Light"})
    hass.states.async_set("weather.home", "sunny")
    for component in ("homeassistant", "intent", "conversation", "assist_pipeline"):
        assert await async_setup_component(hass, component, {})
    config = await hass.async_add_executor_job(load_yaml_dict, str(EXAMPLE))
    assert set(config) == {"intent_script"}, "the example holds intent scripts and nothing else"
    assert await async_setup_component(hass, "intent_script", config)
    await hass.async_block_till_done()
    return calls


async def _connect(hass: HomeAssistant, url: str, timeout: float = 3.0) -> str:
    """Set the integration up through its config flow; the pipeline prefers local intents."""
    result = await hass.config_entries.flow.async_init(DOMAIN, context={"source": "user"})
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: url, CONF_TIMEOUT: timeout}
    )
    assert result["type"] == "create_entry", result
    await hass.async_block_till_done()
    return await _use_agent(hass, result["result"].entry_id)


async def _use_agent(hass: HomeAssistant, entry_id: str) -> str:
    entity_id = er.async_get(hass).async_get_entity_id("conversation", DOMAIN, entry_id)
    assert entity_id, "the integration did not create its conversation entity"
    await async_update_pipeline(
        hass, async_get_pipeline(hass), conversation_engine=entity_id, prefer_local_intents=True
    )
    return entity_id


async def _say(hass: HomeAssistant, ws, text: str) -> dict:
    """One Assist turn from text to response, through the websocket API; the intent-end data."""
    await ws.send_json_auto_id(
        {
            "type": "assist_pipeline/run",
            "start_stage": "intent",
            "end_stage": "intent",
            "input": {"text": text},
        }
    )
    msg = await ws.receive_json()
    assert msg["success"], msg
    end = None
    while True:
        msg = await ws.receive_json()
        event = msg["event"]
        assert event["type"] != "error", event
        if event["type"] == "intent-end":
            end = event["data"]
        if event["type"] == "run-end":
            return end


async def _requests(hass: HomeAssistant, server: Server) -> int:
    """POST /predict answered so far; read off the event loop (Home Assistant flags blocking I/O)."""
    await asyncio.sleep(0.3)  # uvicorn writes its access line after the answer
    return await hass.async_add_executor_job(server.predict_requests)


async def _serving(hass: HomeAssistant, server: Server, version: str) -> None:
    deadline = time.monotonic() + 30
    while (await hass.async_add_executor_job(server.healthz))["model_version"] != version:
        assert time.monotonic() < deadline, f"the server never switched to {version}"
        await asyncio.sleep(0.2)


def _targets(calls: list) -> list[str]:
    """The entities a recorded service call targeted (Home Assistant passes them as a list)."""
    ids = [c.data["entity_id"] for c in calls]
    return [e for x in ids for e in (x if isinstance(x, list) else [x])]


def _speech(end: dict) -> str:
    return end["intent_output"]["response"]["speech"]["plain"]["speech"]


def _errors(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


async def test_home_assistants_own_sentences_never_reach_reprogate(
    hass, hass_ws_client, server: Server, caplog
):
    calls = await _home(hass)
    await _connect(hass, server.url)
    ws = await hass_ws_client(hass)
    before = await _requests(hass, server)
    end = await _say(hass, ws, "turn on the kitchen light")
    assert end["processed_locally"] is True
    assert _targets(calls["light.turn_on"]) == ["light.kitchen"]
    assert await _requests(hass, server) == before, "Home Assistant's own sentence went to reprogate"
    assert not _errors(caplog)


async def test_an_unknown_phrasing_runs_the_intent_reprogate_acts_on(
    hass, hass_ws_client, server: Server, caplog
):
    calls = await _home(hass)
    entity_id = await _connect(hass, server.url)
    ws = await hass_ws_client(hass)
    before = await _requests(hass, server)
    end = await _say(hass, ws, "please make the office dark")
    assert end["processed_locally"] is False
    assert _speech(end) == "Kitchen lights off."
    assert _targets(calls["light.turn_off"]) == ["light.kitchen"] and not calls["light.turn_on"]
    assert await _requests(hass, server) == before + 1
    state = hass.states.get(entity_id)
    assert state.attributes["outcome"] == "acted" and state.attributes["intent"] == "lights_off"
    assert state.attributes["model_version"] == server.versions["tiny"]
    assert not _errors(caplog)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("banana phone purple", "I am not confident enough"),
        ("send a text to john", "I am not confident enough"),
    ],
    ids=["low_confidence", "out_of_scope"],
)
async def test_a_query_routed_to_review_acts_on_nothing_and_says_why(
    hass, hass_ws_client, server: Server, caplog, text, why
):
    calls = await _home(hass)
    entity_id = await _connect(hass, server.url)
    ws = await hass_ws_client(hass)
    end = await _say(hass, ws, text)
    said = _speech(end)
    assert said.startswith(f"I did nothing: {why}") and "My best guesses: " in said, said
    assert not calls["light.turn_on"] and not calls["light.turn_off"]
    assert hass.states.get(entity_id).attributes["outcome"] == "review"
    assert not _errors(caplog)


async def test_server_down_slow_or_refusing_is_a_reply_and_no_action(
    hass, hass_ws_client, server: Server, caplog
):
    calls = await _home(hass)
    ws = await hass_ws_client(hass)
    # Down: nothing listens at the URL (set up from an entry, since the flow refuses such a URL).
    down = MockConfigEntry(
        domain=DOMAIN, data={CONF_URL: f"http://127.0.0.1:{free_port()}", CONF_TIMEOUT: 2.0}
    )
    down.add_to_hass(hass)
    assert await hass.config_entries.async_setup(down.entry_id)
    await _use_agent(hass, down.entry_id)
    assert _speech(await _say(hass, ws, "please make the office dark")) == (
        "reprogate could not be reached, so I did nothing."
    )
    # 4xx: the real server, at a path it does not have.
    refusing = MockConfigEntry(domain=DOMAIN, data={CONF_URL: f"{server.url}/nope", CONF_TIMEOUT: 2.0})
    refusing.add_to_hass(hass)
    assert await hass.config_entries.async_setup(refusing.entry_id)
    await _use_agent(hass, refusing.entry_id)
    assert _speech(await _say(hass, ws, "please make the office dark")) == (
        "reprogate refused the request (HTTP 404), so I did nothing."
    )
    # Slow: the real server, paused, does not answer within the timeout.
    slow = await _connect(hass, server.url, timeout=0.5)
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        said = _speech(await _say(hass, ws, "please make the office dark"))
        waited = time.monotonic() - started
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert said == "reprogate did not answer within 0.5 seconds, so I did nothing." and waited < 5
    assert hass.states.get(slow).attributes["outcome"] == "failed"
    assert not calls["light.turn_on"] and not calls["light.turn_off"]
    assert not _errors(caplog), _errors(caplog)
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("custom_components.reprogate")]
    assert any("could not be reached" in w for w in warnings) and any("HTTP 404" in w for w in warnings)


async def test_the_config_flow_refuses_a_url_where_no_reprogate_answers(hass, server: Server):
    await _home(hass)
    result = await hass.config_entries.flow.async_init(DOMAIN, context={"source": "user"})
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: f"http://127.0.0.1:{free_port()}", CONF_TIMEOUT: 1.0}
    )
    assert result["type"] == "form" and result["errors"] == {"base": "cannot_connect"}
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: f"{server.url}/nope", CONF_TIMEOUT: 1.0}
    )
    assert result["errors"] == {"base": "not_reprogate"}


async def test_a_promotion_while_home_assistant_runs_answers_from_the_new_model(
    hass, hass_ws_client, server: Server, caplog
):
    await _home(hass)
    entity_id = await _connect(hass, server.url)
    ws = await hass_ws_client(hass)
    await _say(hass, ws, "please make the office dark")
    assert hass.states.get(entity_id).attributes["model_version"] == server.versions["tiny"]
    new = await hass.async_add_executor_job(server.promote, "tiny2")
    try:
        await _serving(hass, server, new)
        await _say(hass, ws, "please make the office dark")
        assert hass.states.get(entity_id).attributes["model_version"] == new
    finally:
        await hass.async_add_executor_job(server.promote, "tiny")
        await _serving(hass, server, server.versions["tiny"])
    assert not _errors(caplog)


async def test_reprogates_share_of_an_assist_turn(hass, hass_ws_client, server: Server):
    """Text in to response out through Assist, against the agent's HTTP call and the server's
    own latency, per turn; `make bench-home-assistant` writes the numbers to bench/results."""
    await _home(hass)
    entity_id = await _connect(hass, server.url)
    ws = await hass_ws_client(hass)
    turns, calls, served = [], [], []
    for i in range(40):
        started = time.perf_counter()
        await _say(hass, ws, "please make the office dark" if i % 2 else "banana phone purple")
        turns.append((time.perf_counter() - started) * 1000)
        attrs = hass.states.get(entity_id).attributes
        calls.append(attrs["call_ms"])
        served.append(attrs["server_latency_ms"])
    for turn, call, own in zip(turns, calls, served, strict=True):
        assert own <= call <= turn  # the server's time is inside the call, the call inside the turn

    def q(xs: list[float]) -> dict[str, float]:
        cuts = statistics.quantiles(xs, n=20)
        return {"p50": round(statistics.median(xs), 2), "p95": round(cuts[18], 2)}

    report = {
        "turns": len(turns),
        "assist_turn_ms": q(turns),
        "agent_http_call_ms": q(calls),
        "server_latency_ms": q(served),
        "reprogate_share_of_turn_p50": round(
            statistics.median(c / t for c, t in zip(calls, turns, strict=True)), 3
        ),
    }
    print(json.dumps(report))
    if out := os.environ.get("REPROGATE_HA_LATENCY_OUT"):
        await hass.async_add_executor_job(Path(out).write_text, json.dumps(report, indent=2) + "\n")
