"""Set the integration up from the UI: the URL of `reprogate serve`, the answer timeout, and the
intents the agent may run.

The URL is checked before the entry is created (GET /healthz answers with the model being
served), so a typo is a form error, not a silent agent that never answers. The allow-list is
chosen from the served model's own vocabulary (GET /version); by default, the intents this home
has an intent_script for. Whatever a server answers, the agent runs nothing outside it.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import voluptuous as vol
from homeassistant.config_entries import ConfigEntry, ConfigFlow, ConfigFlowResult, OptionsFlow
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import intent
from homeassistant.helpers.aiohttp_client import async_get_clientsession

from .client import TooLarge, get_json, vocabulary
from .const import CONF_INTENTS, CONF_TIMEOUT, CONF_URL, DEFAULT_TIMEOUT, DEFAULT_URL, DOMAIN

TIMEOUT = vol.All(vol.Coerce(float), vol.Range(min=0.1, max=60))


def _schema(url: str, timeout: float) -> vol.Schema:
    return vol.Schema(
        {vol.Required(CONF_URL, default=url): str, vol.Required(CONF_TIMEOUT, default=timeout): TIMEOUT}
    )


async def _check(hass, url: str, timeout: float) -> str | None:
    """None when a reprogate server answers at `url`, else the form's error key. The answer is
    read as the agent reads one: bounded in time and size."""
    try:
        body = await get_json(async_get_clientsession(hass), f"{url.rstrip('/')}/healthz", timeout)
    except (aiohttp.ClientResponseError, TooLarge):  # something answered, but not with a status
        return "not_reprogate"
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return "cannot_connect"
    return None if isinstance(body, dict) and "status" in body else "not_reprogate"


def scripted_intents(hass: HomeAssistant) -> set[str]:
    """The intents this home runs through an intent_script entry (not Home Assistant's built-in
    ones such as HassCancelAllTimers or HassNevermind)."""
    return {
        h.intent_type
        for h in intent.async_get(hass)
        if type(h).__module__.startswith("homeassistant.components.intent_script")
    }


class ReprogateConfigFlow(ConfigFlow, domain=DOMAIN):
    VERSION = 1

    async def async_step_user(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        errors: dict[str, str] = {}
        if user_input is not None:
            url = user_input[CONF_URL].rstrip("/")
            await self.async_set_unique_id(url)
            self._abort_if_unique_id_configured()
            error = await _check(self.hass, url, user_input[CONF_TIMEOUT])
            if error is None:
                known = await vocabulary(async_get_clientsession(self.hass), url, user_input[CONF_TIMEOUT])
                allowed = sorted(set(known or []) & scripted_intents(self.hass))
                return self.async_create_entry(
                    title=f"reprogate ({url})",
                    data={CONF_URL: url, CONF_TIMEOUT: user_input[CONF_TIMEOUT]},
                    options={CONF_INTENTS: allowed},
                )
            errors["base"] = error
        return self.async_show_form(
            step_id="user", data_schema=_schema(DEFAULT_URL, DEFAULT_TIMEOUT), errors=errors
        )

    @staticmethod
    @callback
    def async_get_options_flow(config_entry: ConfigEntry) -> OptionsFlow:
        return ReprogateOptionsFlow()


class ReprogateOptionsFlow(OptionsFlow):
    async def async_step_init(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        current = {**self.config_entry.data, **self.config_entry.options}
        if user_input is not None:
            return self.async_create_entry(
                data={CONF_TIMEOUT: user_input[CONF_TIMEOUT], CONF_INTENTS: sorted(user_input[CONF_INTENTS])}
            )
        timeout = current.get(CONF_TIMEOUT, DEFAULT_TIMEOUT)
        known = await vocabulary(async_get_clientsession(self.hass), current[CONF_URL], timeout)
        allowed = current.get(CONF_INTENTS)
        if allowed is None:
            allowed = sorted(set(known or []) & scripted_intents(self.hass))
        # The model's vocabulary to choose from (and what is allowed now, should the server be down).
        choices = sorted(set(known or []) | set(allowed))
        return self.async_show_form(
            step_id="init",
            data_schema=vol.Schema(
                {
                    vol.Required(CONF_TIMEOUT, default=timeout): TIMEOUT,
                    vol.Required(CONF_INTENTS, default=list(allowed)): cv.multi_select(choices),
                }
            ),
        )
