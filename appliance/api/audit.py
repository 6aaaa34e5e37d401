"""GET /api/v1/audit: the tenant's audit log (appliance/services/audit.py), newest first."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Annotated

from litestar import Request, Response, get
from litestar.params import QueryParameter

from appliance.api.auth import principal
from appliance.api.io import ok, query_int, query_str
from appliance.api.leads import DEFAULT_LIMIT, MAX_LIMIT, query_date_bound
from appliance.clock import iso
from appliance.errors import ValidationFailed
from appliance.services import audit
from appliance.storage import AuditFilter

TAGS = ["Audit"]  # this module's group in the OpenAPI document
Query = Annotated[str | None, QueryParameter()]
ACTOR = r"^(cli|anonymous|user:[A-Za-z0-9_]{1,64}|key:[A-Za-z0-9_]{1,64})$"
ACTION = r"^[a-z][A-Za-z_]{0,39}(\.[a-z][A-Za-z_]{0,39}){1,3}$"
_ACTOR, _ACTION = re.compile(ACTOR), re.compile(ACTION)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
DAY_OR_INSTANT = {"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}]}


def _matching(request: Request, name: str, pattern: re.Pattern[str], form: str) -> str | None:
    value = query_str(request, name)
    if value is not None and not pattern.fullmatch(value):
        raise ValidationFailed([f"{name}: must be {form}"])
    return value


def _at(epoch_ms: int | None) -> str | None:
    """A date bound as the log's timestamp text; None past the last moment a timestamp can name."""
    if epoch_ms is None:
        return None
    try:
        return iso(_EPOCH + timedelta(milliseconds=epoch_ms))
    except OverflowError:  # the end of 9999-12-31: every entry is before it
        return None


@get("/api/v1/audit", operation_id="listAudit",
     summary="List the audit log", tags=TAGS,
     description=("Every change made to the tenant, newest first: who (`user:<userId>`, `key:<keyId>` or `cli`), "
                  "what (`action`, e.g. `lead.approve`, `webhook.update`, `bundle.campaign.create`), on what "
                  "(`target`), the state before and after with secrets masked, and the request's address and id. "
                  "Filtered by actor, action and dates; 400 names a bad filter. Needs the admin role."),
     opt={"data": audit.AuditPage, "errors": ["VALIDATION_ERROR"],
          "query": {"cursor": {"type": "string", "pattern": "^[0-9]+$",
                               "description": "nextCursor of the previous page."},
                    "actor": {"type": "string", "pattern": ACTOR},
                    "action": {"type": "string", "pattern": ACTION},
                    "startDate": {**DAY_OR_INSTANT, "description": "Inclusive."},
                    "endDate": {**DAY_OR_INSTANT, "description": "Inclusive: a date means through its end (UTC)."}}})
async def list_audit(
    request: Request,
    cursor: Query = None,
    limit: Query = None,
    actor: Query = None,
    action: Query = None,
    start_date: Annotated[str | None, QueryParameter(name="startDate")] = None,
    end_date: Annotated[str | None, QueryParameter(name="endDate")] = None,
) -> Response:
    per_page = query_int(request, "limit", DEFAULT_LIMIT, maximum=MAX_LIMIT)
    before = query_int(request, "cursor", 0, minimum=1) or None
    tenant_id = principal(request.scope).tenant_id
    return ok(await audit.page(request.app.state.runtime, tenant_id, audit_filter(request), before, per_page))


def audit_filter(request: Request) -> AuditFilter:
    """The query's filters (the console's audit page reads the same ones)."""
    start, end = date_range(request)
    return AuditFilter(actor=_matching(request, "actor", _ACTOR, "cli, anonymous, user:<userId> or key:<keyId>"),
                       action=_matching(request, "action", _ACTION, "a dotted action name such as lead.approve"),
                       start=start, end=end)


def date_range(request: Request) -> tuple[str | None, str | None]:
    """`startDate` and `endDate` as timestamps: (inclusive start, exclusive end), each None when
    not given (or, for the end, past the last moment a timestamp can name)."""
    start_ms = query_date_bound(request, "startDate", end=False)
    end_ms = query_date_bound(request, "endDate", end=True)
    if start_ms is not None and end_ms is not None and end_ms <= start_ms:
        raise ValidationFailed(["endDate: must not be before startDate"])
    return _at(start_ms), _at(end_ms)


ROUTES = [list_audit]
