"""The intake-action and prompt hooks, called by the product itself: a plugin file dropped into
the plugin folder (`[plugins] dirs` of the test's config), the app started with it, leads
submitted through the HTTP API. Each test looks at what only the hook can have caused: the lines
the intake-action plugin writes, and leads disqualified by a prompt only the plugin can decide.
(tests/test_plugins.py calls the same hooks through the registry, not through a submit.)"""

from __future__ import annotations

import json
from pathlib import Path

from litestar.testing import TestClient

from appliance.app import create_app
from appliance.services import tenancy
from tests.buyer_server import wait_until
from tests.bundles import campaign
from tests.conftest import make_tenant
from tests.worker_helpers import endpoint, lead_body, live_app, status_is, submit, wait_for

# Writes each intake action it is handed, as a JSON line, beside itself.
INTAKE_RECORDER = '''
import json
from pathlib import Path

from appliance.sdk import hookimpl

RECORD = Path(__file__).with_name("intake_actions.jsonl")


@hookimpl
def appliance_intake_action(action):
    with RECORD.open("a") as out:
        out.write(json.dumps({"action": action.action, "campaignId": action.campaign_id,
                              "submissionId": action.submission_id, "config": action.config,
                              "leadId": action.lead["leadId"], "email": action.lead["email"]}) + "\\n")
'''

# A stand-in for a model deciding prompts: "Do the notes mention WORD?" holds when the lead's
# notes contain WORD; any other prompt is left undecided.
NOTES_JUDGE = '''
from appliance.sdk import hookimpl

QUESTION = "Do the notes mention "


@hookimpl
def appliance_evaluate_prompt(prompt, facts):
    if not prompt.startswith(QUESTION):
        return None
    return prompt.removeprefix(QUESTION).rstrip("?") in (facts.get("notes") or "")
'''

RENTERS = {"name": "Renters", "subRules": [{"conditions": [
    {"prompt": "Do the notes mention renting?", "maxSeverity": "disqualify"}]}]}
RENTERS_REASON = 'Disqualified by rule set "Renters": prompt "Do the notes mention renting?"'
ENGAGE = {"enabled": True, "action": "engage", "engage": {"goalId": "book-a-call"}}
WORKFLOW = {"enabled": True, "action": "workflow", "workflow": {"workflowDefinitionId": "wf-callback"}}


def drop_plugins(tmp_path: Path) -> Path:
    """The two plugin files in the config's plugin folder; the file the recorder writes."""
    folder = tmp_path / "plugins"
    folder.mkdir(exist_ok=True)
    (folder / "intake_recorder.py").write_text(INTAKE_RECORDER)
    (folder / "notes_judge.py").write_text(NOTES_JUDGE)
    return folder / "intake_actions.jsonl"


def recorded(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def lead_of(client: TestClient, tenant, lead_id: str) -> dict:
    response = client.get(f"/api/v1/leads/{lead_id}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def test_a_submit_hands_its_first_intake_action_to_the_plugin(runtime, tmp_path):
    record = drop_plugins(tmp_path)
    tenant = make_tenant(runtime, "T", {"campaigns": [
        campaign("EN1", "Engage", firstIntakeAction=ENGAGE),
        campaign("WF1", "Workflow", firstIntakeAction=WORKFLOW),
        campaign("PL1", "Plain")]})
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
        engaged = submit(client, tenant, lead_body("EN1"))
        handed = submit(client, tenant, lead_body("WF1"))
        plain = submit(client, tenant, lead_body("PL1"))
        assert (engaged["status"], handed["status"], plain["status"]) == ("pending_action", "pending_action", "qualified")
        emails = [lead_of(client, tenant, data["leadId"])["email"] for data in (engaged, handed)]
    # The hook ran by the time the submit was answered: once per held lead, none for the plain one.
    assert recorded(record) == [
        {"action": "engage", "campaignId": "EN1", "submissionId": engaged["submissionId"],
         "config": {"goalId": "book-a-call"}, "leadId": engaged["leadId"], "email": emails[0]},
        {"action": "workflow", "campaignId": "WF1", "submissionId": handed["submissionId"],
         "config": {"workflowDefinitionId": "wf-callback"}, "leadId": handed["leadId"], "email": emails[1]}]


def test_a_prompt_rule_is_decided_by_the_plugin_at_submit(runtime, tmp_path):
    drop_plugins(tmp_path)
    tenant = make_tenant(runtime, "T", {"campaigns": [campaign("PR1", "Owners only", qualification={"rules": [RENTERS]})]})
    with TestClient(create_app(runtime, background=False), raise_server_exceptions=False) as client:
        renter = submit(client, tenant, lead_body("PR1", notes="renting an apartment"))
        owner = submit(client, tenant, lead_body("PR1", notes="owns a house"))
        # Without the plugin's verdict the prompt is skipped and both leads qualify.
        assert (renter["status"], owner["status"]) == ("disqualified", "qualified")
        submission = lead_of(client, tenant, renter["leadId"])["submissions"][-1]
    assert submission["qualification"]["reason"] == RENTERS_REASON


def test_deferred_evaluation_and_delivery_rules_use_the_same_hooks(runtime, tmp_path):
    """A source that skips evaluation at submit has its leads evaluated by the job loop, and a
    rule that applies at delivery is decided just before sending: both ask the plugins too."""
    record = drop_plugins(tmp_path)
    at_delivery = {**RENTERS, "appliesAt": "delivery"}
    tenant = make_tenant(runtime, "T", {"deliveryEndpoints": [endpoint()], "campaigns": [
        campaign("LT1", "Evaluated later", firstIntakeAction=ENGAGE, qualification={"rules": [RENTERS]},
                 ingestion={"sources": [{"sourceId": "fast", "shortCircuitSyncEvaluation": True}]}),
        campaign("DL1", "Checked at delivery", qualification={"rules": [at_delivery]},
                 delivery={"deliveryEndpointId": "ep"})]})
    source = {"X-API-Key": tenancy.create_key(runtime, tenant.tenant_id, source_id="fast").key}
    with live_app(runtime, tmp_path) as live:
        def submit_as_source(body: dict) -> dict:
            response = live.post("/api/v1/leads/submit", json=body, headers=source)
            assert response.status_code == 201, response.text
            return response.json()["data"]

        held = submit_as_source(lead_body("LT1", notes="owns a house"))
        renter = submit_as_source(lead_body("LT1", notes="renting an apartment"))
        assert (held["status"], renter["status"]) == ("pending", "pending")  # nothing decided at submit
        wait_for(live, tenant, held["leadId"], status_is("pending_action"))
        evaluated = wait_for(live, tenant, renter["leadId"], status_is("disqualified", "pending_action"))
        assert evaluated["status"] == "disqualified"
        assert evaluated["submissions"][-1]["qualification"]["reason"] == RENTERS_REASON

        sent = submit(live, tenant, lead_body("DL1", notes="owns a house"))
        kept = submit(live, tenant, lead_body("DL1", notes="renting an apartment"))
        assert wait_for(live, tenant, sent["leadId"], status_is("delivered", "disqualified"))["status"] == "delivered"
        stopped = wait_for(live, tenant, kept["leadId"], status_is("delivered", "disqualified"))
        assert stopped["status"] == "disqualified" and stopped["submissions"][-1]["result"] == RENTERS_REASON
    # The intake action ran for the lead the job loop held (just after its commit), and only for it.
    assert wait_until(lambda: recorded(record), 10)
    assert [(line["action"], line["submissionId"]) for line in recorded(record)] == [("engage", held["submissionId"])]
