"""Text hetsgd shows but did not write itself: control characters escaped, secrets redacted,
formulas kept out of CSV cells.

A run folder's name, a summary's ``error`` or an exception's message may come from someone
else's folder and hold terminal escape sequences (``ESC ]52;c;...`` writes the clipboard,
``ESC [2J`` clears the screen); a tracking URI may hold a password. :func:`shown` writes every
control character as ``\\xNN`` before such text reaches a terminal, a log or a report;
:func:`redacted` puts ``***`` in place of the secrets of the URIs in a text before hetsgd writes
or prints it (the run itself keeps the real URI); :func:`spreadsheet_cell` keeps a text that a
spreadsheet would evaluate (``=HYPERLINK(...)``) out of the CSVs hetsgd writes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

#: C0, DEL and C1: ESC (0x1b) starts every terminal escape sequence, 0x9b is the C1 form of CSI.
_CONTROL = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
#: Unicode's bidirectional controls (marks, embeddings, overrides, isolates): U+202E shows the
#: text after it right to left, so that a name reads as another (``exe.txt`` as ``txt.exe``).
_CONTROL.update({code: f"\\u{code:04x}" for code in (0x200E, 0x200F, *range(0x202A, 0x202F),
                                                     *range(0x2066, 0x206A))})
#: A text's own layout, which moves no cursor back: line breaks and tabs (Hydra's sweep log).
_CONTROL_BUT_LINES = {code: text for code, text in _CONTROL.items() if chr(code) not in "\n\t"}

#: Query parameters whose value is a credential (lower case; ``*_token`` and the like too).
SECRET_PARAMS = frozenset({"token", "access_token", "refresh_token", "id_token", "auth",
                           "key", "api_key", "apikey", "secret", "client_secret", "password",
                           "passwd", "pwd", "sig", "signature", "credential", "credentials"})
_SECRET_SUFFIXES = ("_token", "_key", "_secret", "_password", "_signature")
REDACTED = "***"
# a URI up to a space or quote, but not the punctuation that ends a sentence after it
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]*[^\s'\"<>`.,:;)]")
# a query's secret outside a whole URI: an error message quoting only a URL's path and query
_LOOSE_PARAM = re.compile(
    r"(?P<lead>[?&;](?P<name>[A-Za-z0-9_.-]+)=)(?:[^&#\s'\"<>`]*[^&#\s'\"<>`.,:;)])?")


def shown(text: object, *, lines: bool = False) -> str:
    """``text`` as it may be shown: every C0 and C1 control character and DEL (ESC included)
    written as ``\\xNN``, and every bidirectional control as ``\\uNNNN``; with ``lines``, line
    breaks and tabs are kept (a report's own lines, a log's)."""
    return str(text).translate(_CONTROL_BUT_LINES if lines else _CONTROL)


#: What makes a spreadsheet read a cell as a formula (or, tab and CR, hide one behind them).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(value: Any) -> Any:
    """A CSV cell that no spreadsheet evaluates: a text that starts like a formula (``=``,
    ``+``, ``-``, ``@``, a tab or CR) behind a ``'``, as OWASP advises; numbers, and texts that
    read as one (``-0.5``), are left as they are (a negative number is not a formula)."""
    if not isinstance(value, str) or not value.startswith(_FORMULA_START):
        return value
    try:
        float(value)
    except ValueError:
        return "'" + value
    return value


def is_secret(param: str) -> bool:
    """Whether a query parameter's value is a credential, by its name."""
    name = param.lower()
    return name in SECRET_PARAMS or name.endswith(_SECRET_SUFFIXES)


def redacted_uri(uri: str) -> str:
    """``uri`` with the password of its user info (or the user info itself, where it has no
    password) and its secret query values as ``***``; the rest as it was, character for
    character."""
    try:
        parts = urlsplit(uri)
        password = parts.password
    except ValueError:  # e.g. a port that is not a number: not a URI to take apart
        return uri
    user_info, at, host = parts.netloc.rpartition("@")
    if password is not None:
        uri = uri.replace(parts.netloc, f"{user_info.partition(':')[0]}:{REDACTED}@{host}", 1)
    elif at:  # a user alone is often a token (https://TOKEN@host/...)
        uri = uri.replace(parts.netloc, f"{REDACTED}@{host}", 1)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if any(is_secret(name) for name, _ in pairs):
        query = urlencode([(name, REDACTED if is_secret(name) else value)
                           for name, value in pairs], safe="*")
        uri = uri.replace(f"?{parts.query}", f"?{query}", 1)
    return uri


def redacted(text: str) -> str:
    """``text`` with every URI in it redacted (:func:`redacted_uri`), and any other
    ``?token=VALUE`` or ``&key=VALUE`` (a URL quoted from its path on) as ``...=***``."""
    text = _URI.sub(lambda match: redacted_uri(match.group()), text)
    return _LOOSE_PARAM.sub(lambda match: match["lead"] + REDACTED if is_secret(match["name"])
                            else match.group(), text)


def _safe_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
    """A log record whose message is redacted and has its control characters escaped (line
    breaks kept: a traceback's), whichever logger made it and whichever handler writes it."""
    record = _plain_record(*args, **kwargs)
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string: logging reports it when it writes
        return record
    record.msg, record.args = shown(redacted(message), lines=True), None
    return record


_plain_record = logging.getLogRecordFactory()


def guard_logging() -> Callable[..., logging.LogRecord]:
    """Make every log record safe to show (:func:`_safe_record`): logging's own hook for
    records, which outlasts the handlers Hydra sets up again for each job and for its launcher
    (which logs each job's overrides). Returns the factory it replaced, to put back."""
    global _plain_record
    previous = logging.getLogRecordFactory()
    if previous is not _safe_record:
        _plain_record = previous
        logging.setLogRecordFactory(_safe_record)
    return previous
