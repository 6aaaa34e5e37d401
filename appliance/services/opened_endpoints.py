"""A tenant's delivery endpoints with their credentials opened from the secret store, ready to
send to (a delivery, or an auction's ping), kept by the tenant's config revision: endpoints and
their sealed credentials change only with it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from appliance.adapters.outbound import Scrubber
from appliance.domain.endpoint import DeliveryEndpoint, fill_credentials, sealed_fields
from appliance.domain.secret_refs import endpoint_secret_ref
from appliance.runtime import Runtime
from appliance.storage import DELIVERY_ENDPOINTS

MAX_KEPT = 1024


@dataclass(frozen=True)
class OpenedEndpoint:
    """A stored endpoint with its credentials filled in from the secret store, ready to send."""
    endpoint: DeliveryEndpoint
    secrets: dict[str, str]  # opened credentials by field (the adapter's `request.secrets`)
    scrubber: Scrubber  # masks those credentials in whatever the buyer answers
    missing: list[str]  # credential fields the endpoint needs and the store does not have


class OpenedEndpoints:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._kept: dict[tuple[str, int, str], OpenedEndpoint | None] = {}

    def get(self, tenant_id: str, rev: int, endpoint_id: str | None) -> OpenedEndpoint | None:
        """The endpoint as of config revision `rev`; None when it does not exist."""
        if not endpoint_id:
            return None
        key = (tenant_id, rev, endpoint_id)
        if key in self._kept:
            return self._kept[key]
        found = self._kept[key] = self._open(tenant_id, endpoint_id)
        if len(self._kept) > MAX_KEPT:
            self._kept.pop(next(iter(self._kept)))
        return found

    def _open(self, tenant_id: str, endpoint_id: str) -> OpenedEndpoint | None:
        tx = self.runtime.store.reader()
        stored = tx.catalog.get_doc(DELIVERY_ENDPOINTS, tenant_id, endpoint_id)
        if stored is None:
            return None
        opened: dict[str, str] = {}
        for field in sealed_fields(stored):
            ref = endpoint_secret_ref(endpoint_id, field)
            blob = tx.secrets.get(tenant_id, ref)
            if blob is not None:
                opened[field] = self.runtime.box.open_bytes(blob, f"{tenant_id}/{ref}")
        endpoint, missing = fill_credentials(stored, opened)
        # URL parts are stored as written (percent-encoded): a peer may echo them decoded.
        known = [*opened.values(), *(unquote(v) for f, v in opened.items() if f.startswith("url."))]
        username = stored.auth.username if stored.auth is not None else None
        pairs = [(username, opened.get("auth.password"))]
        return OpenedEndpoint(endpoint, opened, Scrubber(known, pairs), missing)
