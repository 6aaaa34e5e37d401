"""Who may do what: the roles of people and keys, and the one table of what each API operation
and console action needs (CONTRACT 9.3). Each staff role includes the ones before it: a viewer
reads everything of its tenant; a reviewer also approves, rejects and reposts; a manager also
pauses and resumes buyers, redelivers, submits and imports leads, edits leads, decides returns, credits clients,
and edits suppression lists and webhooks; an admin also manages users (not owners) and keys; an
owner does everything. `buyer` and `supplier` are parties' roles, for their portal: no staff
operation admits them."""

from __future__ import annotations

STAFF_ROLES = ("viewer", "reviewer", "manager", "admin", "owner")  # from least to most
PARTY_ROLES = ("buyer", "supplier")
ROLES = STAFF_ROLES + PARTY_ROLES
KEY_ROLES = STAFF_ROLES  # what `key create --role` takes; a key is nobody's portal
_RANK = {role: rank for rank, role in enumerate(STAFF_ROLES)}

VIEWER, REVIEWER, MANAGER, ADMIN, OWNER = STAFF_ROLES

# What each operation needs: the API's by operationId, the console's by "console:<action>". An
# operation missing here needs `owner` (refused to everyone else), and tests/test_permissions.py
# checks every route of the OpenAPI document against this table.
NEEDED: dict[str, str] = {
    # reading
    "listCampaigns": VIEWER, "listQuestionnaires": VIEWER, "listFieldLibrary": VIEWER,
    "getFieldLibraryEntry": VIEWER, "listLeads": VIEWER, "getLead": VIEWER, "getSubmission": VIEWER,
    "getFile": VIEWER, "getFileContent": VIEWER, "listFiles": VIEWER, "listLeadMessages": VIEWER, "checkSmsOptOut": VIEWER,
    "listSmsOrphanMessages": VIEWER, "listLedgerEntries": VIEWER,
    "getReportSummary": VIEWER, "listWebhooks": VIEWER, "getWebhook": VIEWER, "listWebhookDeliveries": VIEWER,
    "listSuppressionLists": VIEWER, "getSuppressionList": VIEWER, "listEndpoints": VIEWER,
    "listActivity": VIEWER, "getImport": VIEWER, "listLeadAuctions": VIEWER, "listPings": VIEWER,
    "getSourceSpec": VIEWER,
    "options": VIEWER,  # an OPTIONS request: the methods of a route
    # deciding on leads
    "approveLead": REVIEWER, "repostLead": REVIEWER,
    # running the desk
    "submitLead": MANAGER, "pingLead": MANAGER, "importLeads": MANAGER, "updateLead": MANAGER,
    "bulkUpdateLeads": MANAGER, "updateSubmission": MANAGER, "upsertFile": MANAGER, "deliverLead": MANAGER,
    "redeliverLeads": MANAGER, "returnLead": MANAGER, "sendSms": MANAGER, "firePixel": MANAGER,
    "pauseEndpoint": MANAGER, "resumeEndpoint": MANAGER, "createWebhook": MANAGER, "updateWebhook": MANAGER,
    "deleteWebhook": MANAGER, "createSuppressionList": MANAGER, "changeSuppressionEntries": MANAGER,
    # people and the record of what they did
    "listUsers": ADMIN, "getUser": ADMIN, "createUser": ADMIN, "updateUser": ADMIN, "disableUser": ADMIN,
    "listAudit": ADMIN,
    # clients: the configuration
    "listReturnRequests": VIEWER, "createReturnRequest": REVIEWER, "decideReturnRequest": MANAGER,
    "listClients": VIEWER, "getClient": VIEWER, "createClient": ADMIN, "updateClient": ADMIN,
    "getClientStatement": VIEWER, "createClientCredit": MANAGER,
    # the console
    "console:read": VIEWER, "console:decide": REVIEWER, "console:repost": REVIEWER,
    "console:redeliver": MANAGER, "console:pause": MANAGER, "console:returns": MANAGER, "console:credit": MANAGER, "console:import": MANAGER, "console:users": ADMIN, "console:audit": ADMIN,
}


def allows(role: str, needed: str) -> bool:
    """Whether `role` may do what needs `needed` (parties' roles: no staff operation)."""
    rank = _RANK.get(role)
    return rank is not None and rank >= _RANK[needed]


def needed_for(operation: str) -> str:
    return NEEDED.get(operation, OWNER)


def may_manage(actor_role: str, target_role: str) -> bool:
    """Whether someone of `actor_role` may create, change or disable a user of `target_role`
    (or give that role): owners anyone, admins anyone but owners."""
    return actor_role == OWNER or (actor_role == ADMIN and target_role != OWNER)
