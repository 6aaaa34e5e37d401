"""The process's logging, configured once by `serve` and `demo` from `[logging]`: one handler on
stderr for every logger (uvicorn's included), as text lines or JSON lines.

JSON lines carry `time, level, process, pid, logger, message`, the ids of what the line is about (`requestId`,
`tenantId`, `leadId`, `submissionId`) and, for a logged exception, `exception` (its traceback).
The ids come from a context variable: the request edge binds the request id, authentication the
tenant, the delivery worker the job's lead and submission, each for its own task only.

`process` names which of the appliance's processes wrote the line (`server`, or `delivery` when
the delivery worker runs in a process of its own: appliance/processes.py); text lines carry it as
`server[pid]` before the logger's name.

No secret may reach a log line: code logs exception types and places, or text that has passed
the outbound Scrubber (appliance/adapters/outbound.py)."""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from typing import Any

import msgspec

CONTEXT_KEYS = ("requestId", "tenantId", "leadId", "submissionId")
_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("appliance_log_context",
                                                                                default=None)


def bind(**ids: str | None) -> None:
    """Add ids to the current task's log context (a new dict: other tasks keep theirs)."""
    current = _context.get()
    _context.set({**(current or {}), **{k: v for k, v in ids.items() if v is not None}})


def bind_request(request_id: str, state: dict) -> None:
    """A request's context: its id, and its tenant read from the request state when a line is
    written (authentication sets it later; looking it up then costs a request nothing)."""
    _context.set({"requestId": request_id, _REQUEST_STATE: state})  # type: ignore[dict-item]


_REQUEST_STATE = "_state"


def request_origin() -> tuple[str | None, str | None]:
    """(request id, client address) of the request being served; (None, None) outside one."""
    ids = _context.get()
    if not ids:
        return None, None
    state = ids.get(_REQUEST_STATE)
    client = state.get("client") if state is not None else None  # type: ignore[attr-defined]
    return ids.get("requestId"), client[0] if client else None


def bound() -> dict[str, str]:
    ids = _context.get()
    if not ids:
        return {}
    state = ids.get(_REQUEST_STATE)
    if state is None:
        return ids
    principal = state.get("principal")  # type: ignore[attr-defined]
    found = {"requestId": ids["requestId"]}
    if principal is not None:
        found["tenantId"] = principal.tenant_id
    return found


def _stamp(record: logging.LogRecord) -> str:
    seconds = int(record.created)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))}.{int(record.msecs):03d}Z"


_process = ["server"]  # this process's role, set by `configure`


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": _stamp(record), "level": record.levelname, "process": _process[0],
                                "pid": record.process, "logger": record.name, "message": record.getMessage(),
                                **bound()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return msgspec.json.encode(line).decode()


class TextLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ids = " ".join(f"{k}={v}" for k, v in bound().items())
        text = (f"{_stamp(record)} {record.levelname:<7} {_process[0]}[{record.process}] {record.name}: "
                f"{record.getMessage()}")
        if ids:
            text += f" [{ids}]"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


# httpx logs every outgoing request's full URL at INFO (httpcore, at DEBUG, its response headers):
# a buyer's or provider's URL may carry a credential in its query string. Our own delivery
# records show URLs with query values masked; these library loggers stay quiet below WARNING.
QUIET_LOGGERS = ("httpx", "httpcore")


def quiet_libraries() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def configure(fmt: str, level: str, *, process: str = "server") -> None:
    """Route every logger through one stderr handler in `fmt` ("text" or "json") at `level`;
    `process` is the role every line names."""
    _process[0] = process
    quiet_libraries()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if fmt == "json" else TextLines())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "litestar"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
