"""Keep secrets out of logs, MLflow params and tags: credentials in URIs, and values of secret-looking
environment variables (names containing TOKEN, KEY, SECRET, PASSWORD...)."""

import logging
import os
import re
import unicodedata

SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
# A scheme starts where no scheme character precedes it (the lookbehind): else every letter of a long word would
# start a scan to its end, quadratic in its length (a 1 MB value in a config file hung a run)
_URI_CREDENTIALS = re.compile(r"(?P<scheme>(?<![a-zA-Z0-9+.-])[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/@:\s]*)(:[^/@\s]*)?@")
# A database URI's password as SQLAlchemy reads it: up to an `@`, with `/` allowed; a second `@` typed in it
# (unencoded) is masked too, up to the `@` before the host. Not for http(s), whose paths may hold an `@`.
_DB_CREDENTIALS = re.compile(
    r"(?P<scheme>(?<![a-zA-Z0-9+.-])(?!https?://)[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/@:\s]*):[^\s?#]*@(?=[^@\s/?#]*(?:[/?#\s]|$))"
)
# a query parameter named like a secret (?password=..., &access_token=...): its value, up to a quote, a comma, a
# parenthesis or a colon that ends a sentence
_QUERY_SECRET = re.compile(
    r"""(?P<name>[?&;][^=&#\s?;]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)[^=&#\s?;]*=)(?:[^&#\s;'"),:]|:(?!\s|$))+""",
    re.IGNORECASE,
)
MASK = "***"


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def redact_uri(text: str) -> str:
    """http://user:pass@host -> http://user:***@host, and http://token@host -> http://***@host: a user part with
    no password is how a token is given (anywhere in the text); ?password=s3cret -> ?password=*** for any query
    parameter named like a secret."""

    def mask(m) -> str:
        return f"{m['scheme']}{m['user']}:{MASK}@" if m.group(3) is not None else f"{m['scheme']}{MASK}@"

    text = _DB_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", str(text))
    return _QUERY_SECRET.sub(lambda m: f"{m['name']}{MASK}", _URI_CREDENTIALS.sub(mask, text))


def _secret_values():
    return sorted((v for k, v in os.environ.items() if is_secret_name(k) and len(v) >= 4), key=len, reverse=True)


def redact(text: str) -> str:
    """Mask URI credentials and the value of every secret-looking environment variable."""
    text = redact_uri(text)
    for value in _secret_values():
        text = text.replace(value, MASK)
    return text


def error_line(err: BaseException, limit: int = 300) -> str:
    """An exception said in one redacted line (its first; its type's name when it says nothing), at most `limit`
    characters: what a one-paragraph error quotes of a library's message."""
    text = str(err).strip()
    return redact(text.splitlines()[0] if text else type(err).__name__)[:limit]


def redact_mapping(items: dict[str, str]) -> dict[str, str]:
    """Params or tags: a secret-looking key gets its value masked; every other value is redacted."""
    return {k: MASK if is_secret_name(k.rsplit(".", 1)[-1]) else redact(v) for k, v in items.items()}


class RedactingStream:
    """sys.stdout while Hydra prints a config or help (--cfg job, --resolve, --help): each write masked as log lines
    are, so a password in mlflow.tracking_uri or a secret resolved through ${oc.env:...} does not reach the screen."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class Redacting(logging.Filter):
    """On a log handler: every line it writes is redacted (a path or URI built from a secret can reach any message)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return True


def redact_logs() -> None:
    """Redact every line the root logger's handlers (Hydra's console and runner.log) write."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, Redacting) for f in handler.filters):
            handler.addFilter(Redacting())


def visible(text: str) -> str:
    """`text` with characters that print as nothing (a zero-width space, a control character) written as <U+200B>."""
    return "".join(f"<U+{ord(c):04X}>" if unicodedata.category(c) in ("Cf", "Cc", "Zl", "Zp") else c for c in text)
