"""Names shared by the config flow and the conversation agent."""

DOMAIN = "reprogate"
CONF_URL = "url"
CONF_TIMEOUT = "timeout"
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 5.0
# The server refuses longer texts with 422 (reprogate.serve.app.MAX_TEXT_CHARS, 1000); cut before sending
# so a long dictation is still answered, and say so.
MAX_TEXT_CHARS = 1000
# The intents the agent may run when reprogate answers `act`: an allow-list of the model's own
# vocabulary, chosen in the config and options flows (default: those with an intent_script).
CONF_INTENTS = "intents"
# A prediction is a few hundred bytes; a body past this is refused unread (a hostile or broken
# server could otherwise make Home Assistant hold gigabytes).
MAX_RESPONSE_BYTES = 64 * 1024
