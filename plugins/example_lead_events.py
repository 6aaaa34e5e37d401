"""Example `on_lead_event` plugin: append every lead event to a JSON-lines file, the way a plugin
would push them to a CRM or a queue.

Copy this file into a plugin folder (`[plugins] dirs`, or `plugins/` next to the binary). Each
event arrives once its change is committed, in order per lead, as webhook receivers get it:
`{"type": "lead.delivered", "timestamp": "...", "data": {...the lead, submissionId, status,
delivery}}`. The file is `lead-events.jsonl` in the working directory, or the path in the
environment variable APPLIANCE_LEAD_EVENTS_FILE.

The hook runs on the server's event loop: keep it quick (hand slow work to a thread or a queue).
An exception is logged with its traceback and the other plugins still get the event; the lead
is not affected.
"""

from __future__ import annotations

import json
import os
from typing import Any

from appliance.sdk import hookimpl


@hookimpl
def on_lead_event(tenant_id: str, event: dict[str, Any]) -> None:
    path = os.environ.get("APPLIANCE_LEAD_EVENTS_FILE", "lead-events.jsonl")
    line = {"tenantId": tenant_id, "type": event["type"], "leadId": event["data"].get("leadId"),
            "status": event["data"].get("status"), "timestamp": event["timestamp"]}
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
