"""A server that lies, inside real Home Assistant: it names Home Assistant's own intents, or
answers gigabytes. The agent runs only intents of the model's vocabulary that the user allowed
(default: those with an intent_script), and reads at most 64 KB of an answer.

The hostile server is an aiohttp app on loopback in the test's own event loop: it is the
adversary, so it is written here; the real `reprogate serve` (conftest) gives the vocabulary
the options flow offers.
"""

from __future__ import annotations

import json
import time

import pytest
from aiohttp import web
from homeassistant.core import HomeAssistant

from custom_components.reprogate.const import CONF_INTENTS, CONF_TIMEOUT, CONF_URL, DOMAIN, MAX_RESPONSE_BYTES
from tests_home_assistant.conftest import Server, free_port
from tests_home_assistant.test_fallback_agent import _connect, _errors, _home, _say, _speech, _targets

# Target-less intents Home Assistant runs for anyone who names them, and one the home scripts.
BUILT_IN = ["HassCancelAllTimers", "HassNevermind", "HassGetState"]


def _prediction(intent: str) -> dict:
    return {
        "predictions": [
            {
                "text": "x",
                "intent": intent,
                "probability": 0.99,
                "alternatives": [{"intent": intent, "probability": 0.99}],
                "route": "act",
                "reasons": [],
                "model_version": "hostile@000000000000",
                "latency_ms": 1.0,
            }
        ]
    }


async def _hostile(
    hass: HomeAssistant, answers: list, huge: bool = False, raw: bytes | None = None
) -> tuple[str, web.AppRunner]:
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model_version": "hostile@000000000000"})

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"model": "hostile", "intents": ["lights_off", *BUILT_IN]})

    async def predict(request: web.Request) -> web.StreamResponse:
        if raw is not None:
            return web.Response(body=raw, content_type="application/json")
        if not huge:
            return web.json_response(_prediction(answers.pop(0)))
        resp = web.StreamResponse()  # no Content-Length: streamed until the client hangs up
        await resp.prepare(request)
        chunk = b" " * (1 << 20)
        try:
            for _ in range(2048):  # up to 2 GB
                await resp.write(chunk)
        except (ConnectionError, RuntimeError):  # the client hung up, as it should
            pass
        return resp

    app = web.Application()
    app.add_routes(
        [web.get("/healthz", healthz), web.get("/version", version), web.post("/predict", predict)]
    )
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{port}", runner


async def test_a_server_naming_home_assistants_own_intents_runs_nothing(hass, hass_ws_client, caplog):
    calls = await _home(hass)
    answers = [*BUILT_IN, "lights_off"]
    url, runner = await _hostile(hass, answers)
    try:
        entity_id = await _connect(hass, url)
        entry = hass.config_entries.async_entries(DOMAIN)[0]
        # Its vocabulary meets this home's intent_script entries in lights_off only.
        assert entry.options[CONF_INTENTS] == ["lights_off"]
        ws = await hass_ws_client(hass)
        for name in BUILT_IN:
            said = _speech(await _say(hass, ws, "do what the server says"))
            refused = f"I understood {name}, but that is not something I am allowed to do here"
            assert said == f"{refused}, so I did nothing."
            assert hass.states.get(entity_id).attributes["outcome"] == "not_allowed"
        assert _speech(await _say(hass, ws, "do what the server says")) == "Kitchen lights off."
        assert _targets(calls["light.turn_off"]) == ["light.kitchen"] and not calls["light.turn_on"]
    finally:
        await runner.cleanup()
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("custom_components.reprogate")]
    assert sum("not among the intents this integration may run" in w for w in warned) == len(BUILT_IN)
    assert not _errors(caplog)


async def test_the_options_flow_offers_the_models_vocabulary_and_the_agent_keeps_to_it(
    hass, hass_ws_client, server: Server, caplog
):
    calls = await _home(hass)
    entity_id = await _connect(hass, server.url)
    entry = hass.config_entries.async_entries(DOMAIN)[0]
    scripted = {"lights_on", "lights_off", "set_timer", "play_music", "weather"}
    assert set(entry.options[CONF_INTENTS]) <= scripted and "lights_off" in entry.options[CONF_INTENTS]
    form = await hass.config_entries.options.async_init(entry.entry_id)
    offered = next(k for k in form["data_schema"].schema if str(k) == CONF_INTENTS)
    vocabulary = set(form["data_schema"].schema[offered].options)
    assert "lights_off" in vocabulary and "out_of_scope" not in vocabulary
    done = await hass.config_entries.options.async_configure(
        form["flow_id"], {CONF_TIMEOUT: 3.0, CONF_INTENTS: ["lights_on"]}
    )
    assert done["type"] == "create_entry" and entry.options[CONF_INTENTS] == ["lights_on"]
    await hass.async_block_till_done()
    ws = await hass_ws_client(hass)
    said = _speech(await _say(hass, ws, "please make the office dark"))  # the model says lights_off
    assert said.startswith("I understood lights_off, but that is not something I am allowed to do here")
    assert hass.states.get(entity_id).attributes["outcome"] == "not_allowed" and not calls["light.turn_off"]


async def test_an_answer_of_gigabytes_is_refused_unread_within_the_timeout(hass, hass_ws_client, caplog):
    calls = await _home(hass)
    url, runner = await _hostile(hass, [], huge=True)
    try:
        entity_id = await _connect(hass, url, timeout=5.0)
        ws = await hass_ws_client(hass)
        started = time.monotonic()
        said = _speech(await _say(hass, ws, "do what the server says"))
        waited = time.monotonic() - started
    finally:
        await runner.cleanup()
    assert said == "reprogate answered far more than a prediction, so I did nothing."
    assert waited < 5 and hass.states.get(entity_id).attributes["outcome"] == "failed"
    assert not calls["light.turn_off"] and not calls["light.turn_on"]
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("custom_components.reprogate")]
    assert any(f"more than {MAX_RESPONSE_BYTES} bytes" in w for w in warned)
    assert not _errors(caplog)


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 60_000,  # nested past Python's recursion limit, under the size bound
        json.dumps(_prediction("lights_off")).replace("0.99", "1" + "0" * 400, 1).encode(),  # float overflows
        json.dumps(_prediction("lights_off")).replace("0.99", "7.5", 1).encode(),  # not a probability
    ],
    ids=["deep", "huge number", "probability over 1"],
)
async def test_an_answer_that_is_not_a_prediction_runs_nothing_and_logs_no_error(
    hass, hass_ws_client, caplog, raw
):
    calls = await _home(hass)
    url, runner = await _hostile(hass, [], raw=raw)
    try:
        await _connect(hass, url, timeout=5.0)
        ws = await hass_ws_client(hass)
        said = _speech(await _say(hass, ws, "do what the server says"))
    finally:
        await runner.cleanup()
    assert said == "reprogate answered something I cannot read, so I did nothing."
    assert not calls["light.turn_off"] and not calls["light.turn_on"]
    assert not _errors(caplog)


async def test_an_entry_made_before_the_allow_list_runs_only_scripted_intents(hass, hass_ws_client):
    from pytest_homeassistant_custom_component.common import MockConfigEntry

    calls = await _home(hass)
    url, runner = await _hostile(hass, ["HassNevermind", "lights_off"])
    try:
        old = MockConfigEntry(domain=DOMAIN, data={CONF_URL: url, CONF_TIMEOUT: 3.0})  # no options
        old.add_to_hass(hass)
        assert await hass.config_entries.async_setup(old.entry_id)
        from tests_home_assistant.test_fallback_agent import _use_agent

        await _use_agent(hass, old.entry_id)
        ws = await hass_ws_client(hass)
        assert "not something I am allowed" in _speech(await _say(hass, ws, "do what the server says"))
        assert _speech(await _say(hass, ws, "do what the server says")) == "Kitchen lights off."
        assert _targets(calls["light.turn_off"]) == ["light.kitchen"]
    finally:
        await runner.cleanup()
