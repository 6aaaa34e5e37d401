"""The built-in `demo` delivery adapter: a buyer inside the appliance that accepts every lead, so
`appliance demo` shows a lead go all the way to `delivered` with nothing else running. It sends
nothing anywhere; an endpoint with `adapter = "demo"` needs no URL. For trying the appliance and
for tests of a set-up, never for a real buyer."""

from __future__ import annotations

from typing import Any

import httpx

from appliance.sdk import DeliveryAdapter, DeliveryRequest, DeliveryResult, hookimpl


class DemoBuyer(DeliveryAdapter):
    name = "demo"

    async def deliver(self, request: DeliveryRequest, http: httpx.AsyncClient) -> DeliveryResult:
        return DeliveryResult(outcome="success", status_code=200, client_lead_id=f"DEMO-{request.submission_id[-8:]}",
                              message="accepted by the demo buyer", url="demo:buyer", method="POST",
                              body_format="json")


@hookimpl
def appliance_delivery_adapters(settings: dict[str, Any]) -> list[DeliveryAdapter]:
    """The built-in demo buyer."""
    return [DemoBuyer()]
