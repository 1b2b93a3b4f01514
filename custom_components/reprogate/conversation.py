"""The conversation agent: text Home Assistant did not understand -> reprogate -> act or not.

`act`: the Home Assistant intent named like reprogate's answer runs (an `intent_script:` entry
per intent, whose speech is the reply). `review`: nothing runs; the reply says why and what
the best guesses were. No answer in time, an HTTP error, an unreadable body: nothing runs, the
reply says so, and the log gets one warning, never an exception.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

from homeassistant.components import assist_pipeline, conversation
from homeassistant.config_entries import ConfigEntry
from homeassistant.const import MATCH_ALL
from homeassistant.core import HomeAssistant
from homeassistant.helpers import intent
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.entity_platform import AddEntitiesCallback

from .client import Answer, Failure, predict
from .config_flow import scripted_intents
from .const import CONF_INTENTS, CONF_TIMEOUT, CONF_URL, DEFAULT_TIMEOUT, DOMAIN

_LOGGER = logging.getLogger(__name__)

REASONS = {
    "low_confidence": "I am not confident enough",
    "small_margin": "two intents are too close to call",
    "out_of_scope": "it does not look like something I handle",
    "two_requests": "it asks for two things at once; please ask for one at a time",
    "ambiguous": "it could mean several things; please say a little more",
    "too_short": "it is too short for me to tell what you need; please say a little more",
}


async def async_setup_entry(hass: HomeAssistant, entry: ConfigEntry, add: AddEntitiesCallback) -> None:
    add([ReprogateAgent(entry)])


class ReprogateAgent(conversation.ConversationEntity):
    """Consulted only for what Home Assistant's own sentences did not match (the pipeline's
    prefer_local_intents). No CONTROL feature: with it, the pipeline would keep only
    HassGetState of the local intents and send every command here."""

    def __init__(self, entry: ConfigEntry) -> None:
        self.entry = entry
        self._attr_name = entry.title  # how the pipeline's agent list shows it
        self._attr_unique_id = entry.entry_id
        self._attr_extra_state_attributes = {}
        self._call_ms: float | None = None

    @property
    def supported_languages(self) -> list[str] | Literal["*"]:
        return MATCH_ALL

    async def async_added_to_hass(self) -> None:
        await super().async_added_to_hass()
        assist_pipeline.async_migrate_engine(self.hass, "conversation", self.entry.entry_id, self.entity_id)
        conversation.async_set_agent(self.hass, self.entry, self)

    async def async_will_remove_from_hass(self) -> None:
        conversation.async_unset_agent(self.hass, self.entry)
        await super().async_will_remove_from_hass()

    async def _async_handle_message(
        self, user_input: conversation.ConversationInput, chat_log: conversation.ChatLog
    ) -> conversation.ConversationResult:
        settings = {**self.entry.data, **self.entry.options}
        session = async_get_clientsession(self.hass)
        timeout = float(settings.get(CONF_TIMEOUT, DEFAULT_TIMEOUT))
        started = time.monotonic()
        answer = await predict(session, settings[CONF_URL], user_input.text, timeout)
        self._call_ms = (time.monotonic() - started) * 1000
        if isinstance(answer, Failure):
            _LOGGER.warning("%s", answer.log)
            response = _speech(user_input, answer.say)
            self._remember(None, "failed")
        elif answer.route == "act":
            response = await self._act(user_input, answer)
        else:
            response = _speech(user_input, _review(answer))
            self._remember(answer, "review")
        chat_log.async_add_assistant_content_without_tools(
            conversation.AssistantContent(
                agent_id=user_input.agent_id, content=response.speech.get("plain", {}).get("speech", "")
            )
        )
        return conversation.ConversationResult(response=response, conversation_id=chat_log.conversation_id)

    async def _act(self, user_input: conversation.ConversationInput, answer: Answer) -> intent.IntentResponse:
        settings = {**self.entry.data, **self.entry.options}
        allowed = settings.get(CONF_INTENTS)
        if allowed is None:  # an entry made before the allow-list: the home's intent_script intents
            allowed = scripted_intents(self.hass)
        if answer.intent not in allowed:
            _LOGGER.warning(
                "reprogate answered '%s' with route act, which is not among the intents this integration "
                "may run (%s); nothing was run. Allow it in the integration's options if it should be",
                answer.intent[:100],
                ", ".join(sorted(allowed)) or "none",
            )
            self._remember(answer, "not_allowed")
            return _speech(
                user_input,
                f"I understood {answer.intent[:100]}, but that is not something I am allowed to do here, "
                "so I did nothing.",
            )
        try:
            response = await intent.async_handle(
                self.hass,
                DOMAIN,
                answer.intent,
                {},
                text_input=user_input.text,
                context=user_input.context,
                language=user_input.language,
                device_id=user_input.device_id,
                conversation_agent_id=user_input.agent_id,
            )
        except intent.UnknownIntent:
            _LOGGER.warning(
                "reprogate answered '%s', but no Home Assistant intent of that name is registered; "
                "add an intent_script entry named %s",
                answer.intent,
                answer.intent,
            )
            self._remember(answer, "no_handler")
            return _speech(
                user_input,
                f"I understood {answer.intent}, but nothing in this home is set up to do it, "
                "so I did nothing.",
            )
        except intent.IntentError as e:
            _LOGGER.warning("the intent %s failed: %s", answer.intent, e)
            self._remember(answer, "handler_failed")
            return _speech(user_input, f"I understood {answer.intent}, but doing it failed: {e}")
        if not response.speech:
            response.async_set_speech(f"Done: {answer.intent}.")
        self._remember(answer, "acted")
        return response

    def _remember(self, answer: Answer | None, outcome: str) -> None:
        """The last answer on the entity, for automations and for the person reading the logbook."""
        self._attr_extra_state_attributes = {
            "outcome": outcome,
            "intent": answer.intent if answer else None,
            "probability": answer.probability if answer else None,
            "reasons": answer.reasons if answer else [],
            "model_version": answer.model_version if answer else None,
            "server_latency_ms": answer.latency_ms if answer else None,
            "call_ms": self._call_ms,  # the HTTP round trip from Home Assistant, server time included
        }
        self.async_write_ha_state()


def _speech(user_input: conversation.ConversationInput, text: str) -> intent.IntentResponse:
    response = intent.IntentResponse(language=user_input.language)
    response.async_set_speech(text)
    return response


def _review(answer: Answer) -> str:
    why = "; ".join(REASONS.get(r, r) for r in answer.reasons) or "it was routed to review"
    guesses = ", ".join(f"{name} ({p:.0%})" for name, p in answer.alternatives[:3])
    cut = " (only the first part of what you said was read)" if answer.truncated else ""
    return f"I did nothing: {why}{cut}. My best guesses: {guesses}."
