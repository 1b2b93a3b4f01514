"""reprogate: a fallback conversation agent for Home Assistant's Assist.

Set as an Assist pipeline's conversation agent with "prefer handling commands locally", Home
Assistant's own sentence matching answers what it knows (assist_pipeline's
PipelineRun.recognize_intent tries conversation.async_handle_intents first), and only the rest
reaches `reprogate serve`. An answer routed `act` runs the Home Assistant intent of the same
name (an `intent_script:` entry per intent); anything else is answered and not acted on.
"""

from __future__ import annotations

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant

PLATFORMS = [Platform.CONVERSATION]


async def async_setup_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    entry.async_on_unload(entry.add_update_listener(_reload))
    return True


async def async_unload_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    return await hass.config_entries.async_unload_platforms(entry, PLATFORMS)


async def _reload(hass: HomeAssistant, entry: ConfigEntry) -> None:
    await hass.config_entries.async_reload(entry.entry_id)
