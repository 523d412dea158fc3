"""Storage URLs as shown to a user: the password in a URL, or in a driver's message about it, replaced by ``***``."""

from __future__ import annotations

import re


def _password(url: str) -> str | None:
    """The password in a URL's user info (:func:`_userinfo`), or None."""
    parts = _userinfo(url)
    return parts[1].split(":", 1)[1] if parts is not None and ":" in parts[1] else None


def scrub_secrets(text: str, url: str) -> str:
    """``text`` (a driver's error message about ``url``) with the URL's password, and any piece of it a parser may
    have split off at ``@``, ``:`` or ``/``, replaced by ``***``; then :func:`redact_url` on what is left."""
    secret = _password(url)
    if secret:
        pieces = sorted({secret, *re.split(r"[@:/]", secret)}, key=len, reverse=True)
        for piece in pieces:
            if len(piece) >= 3:
                text = text.replace(piece, "***")
    return redact_url(text)


def _userinfo(url: str) -> tuple[str, str, str] | None:
    """``(scheme, userinfo, after)`` of ``scheme://userinfo@after``, or None. The password may hold ``@``, ``:`` and
    ``/`` unencoded: the user info ends at the last ``@`` before the query."""
    scheme, sep, rest = url.partition("://")
    head = rest.split("?", 1)[0]
    if not sep or "@" not in head:
        return None
    at = head.rindex("@")
    return scheme, rest[:at], rest[at + 1 :]


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***``: in the user info (``postgresql://user:***@host/db``, see
    :func:`_userinfo`) and in a ``password=`` query parameter."""
    parts = _userinfo(url)
    if parts is not None and ":" in parts[1]:
        scheme, userinfo, after = parts
        url = f"{scheme}://{userinfo.split(':', 1)[0]}:***@{after}"
    return re.sub(r"(?i)(password=)[^&;#]*", r"\1***", url)
