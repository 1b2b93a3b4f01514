"""Set the integration up from the UI: the URL of `reprogate serve` and the answer timeout.

The URL is checked before the entry is created (GET /healthz answers with the model being
served), so a typo is a form error, not a silent agent that never answers.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import voluptuous as vol
from homeassistant.config_entries import ConfigEntry, ConfigFlow, ConfigFlowResult, OptionsFlow
from homeassistant.core import callback
from homeassistant.helpers.aiohttp_client import async_get_clientsession

from .const import CONF_TIMEOUT, CONF_URL, DEFAULT_TIMEOUT, DEFAULT_URL, DOMAIN

TIMEOUT = vol.All(vol.Coerce(float), vol.Range(min=0.1, max=60))


def _schema(url: str, timeout: float) -> vol.Schema:
    return vol.Schema(
        {vol.Required(CONF_URL, default=url): str, vol.Required(CONF_TIMEOUT, default=timeout): TIMEOUT}
    )


async def _check(hass, url: str, timeout: float) -> str | None:
    """None when a reprogate server answers at `url`, else the form's error key."""
    try:
        session = async_get_clientsession(hass)
        async with session.get(
            f"{url.rstrip('/')}/healthz", timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            if resp.status != 200:
                return "not_reprogate"
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return "cannot_connect"
    return None if isinstance(body, dict) and "status" in body else "not_reprogate"


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
                return self.async_create_entry(
                    title=f"reprogate ({url})", data={CONF_URL: url, CONF_TIMEOUT: user_input[CONF_TIMEOUT]}
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
        if user_input is not None:
            return self.async_create_entry(data={CONF_TIMEOUT: user_input[CONF_TIMEOUT]})
        current = {**self.config_entry.data, **self.config_entry.options}
        return self.async_show_form(
            step_id="init",
            data_schema=vol.Schema(
                {vol.Required(CONF_TIMEOUT, default=current.get(CONF_TIMEOUT, DEFAULT_TIMEOUT)): TIMEOUT}
            ),
        )
