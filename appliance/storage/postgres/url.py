"""Database URLs in messages: without their password (no driver needed, so the CLI can use it).

libpq takes a password in three places: the URL's user part (`postgresql://u:pw@host/db`), its
query (`?password=pw`, also `sslpassword`), and a key/value string (`host=h password=pw`)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

_PASSWORD_SETTING = re.compile(r"((?:^|[?&\s])(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]+)", re.IGNORECASE)


def redact(url: str) -> str:
    """The URL with every password replaced by ***, for messages and logs."""
    url = _PASSWORD_SETTING.sub(r"\1***", url)
    parts = urlsplit(url)
    if "://" not in url or parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def without_password(url: str) -> tuple[str, str | None]:
    """The URL with no password in it, and the password (decoded) for the tools' environment
    (PGPASSWORD): a command line is visible to every user of the machine."""
    parts = urlsplit(url)
    password = unquote(parts.password) if parts.password is not None else None
    if password is not None:
        parts = parts._replace(netloc=f"{parts.username}@{parts.netloc.rsplit('@', 1)[1]}")
    query = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() == "password":
            password = value
        else:
            query.append((key, value))
    return urlunsplit(parts._replace(query=urlencode(query))), password
