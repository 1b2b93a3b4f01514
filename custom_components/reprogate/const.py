"""Names shared by the config flow and the conversation agent."""

DOMAIN = "reprogate"
CONF_URL = "url"
CONF_TIMEOUT = "timeout"
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 5.0
# The server refuses longer texts with 422 (reprogate.serve.MAX_TEXT_CHARS, 1000); cut before sending
# so a long dictation is still answered, and say so.
MAX_TEXT_CHARS = 1000
