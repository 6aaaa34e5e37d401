"""GET /api/v1/activity: the request log of a tenant (written in batches by the ticker, so the
latest requests appear within a tick)."""

from __future__ import annotations

from appliance.model import Model
from appliance.runtime import Runtime


class ActivityItem(Model):
    key_name: str | None  # null once the key is gone, and for a person's console requests
    actor: str | None     # key:<keyId> or user:<userId>; null before authentication
    method: str
    route: str            # the route template, never the ids in the path
    status: int
    duration_ms: float
    created_at: str
    request_id: str


class ActivityPage(Model):
    items: list[ActivityItem]
    next_cursor: str | None
    has_more: bool


def _actor(principal_id: str | None) -> str | None:
    if not principal_id:
        return None
    return ("user:" if principal_id.startswith("usr_") else "key:") + principal_id


def page(runtime: Runtime, tenant_id: str, before: int | None, limit: int) -> ActivityPage:
    """Newest first; the cursor is the position of the previous page's last item in the log."""
    rows = runtime.store.reader().activity.page(tenant_id, before, limit + 1)
    items = [ActivityItem(key_name=name, actor=_actor(who), method=method, route=route, status=status,
                          duration_ms=duration, created_at=at, request_id=request_id)
             for _, name, method, route, status, duration, at, request_id, who in rows[:limit]]
    more = len(rows) > limit
    return ActivityPage(items=items, next_cursor=str(rows[limit - 1][0]) if more else None, has_more=more)
