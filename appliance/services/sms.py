"""POST /api/v1/sms/send.

Order of work:
1. The body: `message` 1 to 1600 characters, `to` in E.164 (`+` and digits, a possible number
   for its country), `from` an E.164 number, short code or alphanumeric sender id.
2. The lead (NOT_FOUND when it is not the caller's tenant's), then the references in the body,
   each problem a VALIDATION_ERROR naming its field: `campaignId` must be a campaign of the
   tenant (any state: it only steers sender and provider resolution); `interactionId` a
   conversation of this lead; a recipient must exist (`to`, else the lead's phone on file);
   a sender must resolve (appliance/domain/sms_rules.py, with the campaign = `campaignId`,
   else the lead's campaign).
3. Provider (sms_rules.resolve_provider) and its credentials: the tenant provider's own
   (`accountSid`, sealed `authToken` / `apiKey`), each missing one taken from the install-wide
   `[sms.<type>]` table; the built-in default uses the install-wide ones. Base URL: the tenant
   provider's `baseUrl` (checked by the SSRF guard unless `[delivery] allow_private_addresses`),
   else `[sms.<type>] base_url`.
4. The recipient must not have opted out (STOP to one of the tenant's texts): 409 INVALID_STATE
   "recipient opted out", nothing stored or sent. Every send goes through here; only the answer
   to a HELP (services/sms_webhooks.py) is sent whatever the number's choice, as carriers expect.
5. Conversation: with `interactionId` the message is appended to it; otherwise to the open
   conversation of this lead from this sender, else a new one (`int_...`). The message
   (`msg_...`, with its GSM-7 / UCS-2 segment count) is committed with status `sending` before
   the provider is called, then updated to its final status: `sent` (accepted), `failed`
   (refused) or `error` (provider unreachable or down, or not installed).
   With `[server] public_url` set, the provider is asked to report delivery to
   `<public_url>/hooks/sms/<type>/<tenantId>` (a report moves the message's status on).
6. Not accepted: 502 PROVIDER_ERROR whose details carry the provider's reason and the stored
   message id. Credentials never appear in a response, an error, a log line or the store.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from appliance.adapters import netguard
from appliance.adapters.outbound import Scrubber, adapter_crash, http_client
from appliance.clock import iso
from appliance.domain import sms_rules
from appliance.domain.messaging import SmsConfig
from appliance.domain.normalize import to_e164
from appliance.domain.secret_refs import sms_secret_ref
from appliance.domain.suppression import phone_hash
from appliance.errors import InvalidState, NotFound, ProviderError, ValidationFailed
from appliance.ids import new_id
from appliance.model import Model
from appliance.plugins import Registry
from appliance.runtime import Runtime
from appliance.sdk import SmsMessage, SmsResult
from appliance.storage import Conversation, Message

MAX_MESSAGE = 1600

log = logging.getLogger("appliance.services.sms")


class SmsSendBody(Model):
    lead_id: Annotated[str, Meta(min_length=1, max_length=64)]
    message: Annotated[str, Meta(min_length=1, max_length=MAX_MESSAGE)]
    to: Annotated[str, Meta(min_length=1, max_length=32)] | None = None
    sender: Annotated[str, Meta(min_length=1, max_length=32)] | None = msgspec.field(default=None, name="from")
    campaign_id: Annotated[str, Meta(min_length=1, max_length=64)] | None = None
    interaction_id: Annotated[str, Meta(min_length=1, max_length=64)] | None = None


class SmsSendResult(Model):
    """The message's id, status and conversation (interactionId), and what was resolved."""

    message_id: str
    status: str
    interaction_id: str
    lead_id: str
    sender: str = msgspec.field(name="from")
    to: str
    provider: str                     # the provider type: twilio, telnyx or a plugin's
    provider_id: str | None           # the tenant's providerId; null for the built-in default
    provider_message_id: str | None
    segments: int
    encoding: str
    created_at: str


class LeadMessage(Model):
    """One stored message of a lead's conversations (GET /api/v1/leads/{leadId}/messages)."""

    message_id: str
    interaction_id: str
    direction: str
    sender: str = msgspec.field(name="from")
    to: str
    body: str
    # outbound: sending, queued, sent, delivered, undelivered, failed or error; inbound: received
    status: str
    reason: str | None
    provider: str
    provider_id: str | None
    provider_message_id: str | None
    provider_status: str | None
    segments: int
    encoding: str
    created_at: str
    updated_at: str


class LeadMessagePage(Model):
    items: list[LeadMessage]
    next_cursor: str | None
    has_more: bool


def lead_messages(runtime: Runtime, tenant_id: str, lead_id: str, before: str | None, limit: int) -> LeadMessagePage:
    """The lead's messages, newest first (NotFound for a lead that is not the tenant's)."""
    tx = runtime.store.reader()
    with tx:
        if not tx.leads.lead_exists(tenant_id, lead_id):
            raise NotFound()
        rows = tx.messages.lead_messages(tenant_id, lead_id, before, limit + 1)
    items = [LeadMessage(
        message_id=m.message_id, interaction_id=m.interaction_id, direction=m.direction, sender=m.sender,
        to=m.recipient, body=m.body, status=m.status, reason=m.reason, provider=m.provider_type,
        provider_id=m.provider_id, provider_message_id=m.provider_message_id, provider_status=m.provider_status,
        segments=m.segments, encoding=m.encoding, created_at=m.created_at, updated_at=m.updated_at)
        for m in rows[:limit]]
    more = len(rows) > limit
    return LeadMessagePage(items=items, next_cursor=items[-1].message_id if more else None, has_more=more)


class Plan(msgspec.Struct, kw_only=True):
    """A message about to be sent: to whom, from where, through which provider."""

    lead_id: str | None
    recipient: str
    sender: str
    provider: sms_rules.ProviderChoice
    credentials: dict[str, str]
    base_url: str | None
    tenant_base_url: bool
    status_callback_url: str | None = None


def status_callback_url(runtime: Runtime, tenant_id: str, provider_type: str) -> str | None:
    public = runtime.config.server.public_url
    return f"{public.rstrip('/')}/hooks/sms/{provider_type}/{tenant_id}" if public else None


def credentials(runtime: Runtime, tx: Any, tenant_id: str, choice: sms_rules.ProviderChoice) -> dict[str, str]:
    install: dict[str, str] = {}
    if choice.type == "twilio":
        cfg = runtime.config.sms.twilio
        install = {"accountSid": cfg.account_sid, "authToken": cfg.auth_token}
    elif choice.type == "telnyx":
        install = {"apiKey": runtime.config.sms.telnyx.api_key}
    own: dict[str, str] = {}
    provider = choice.provider
    if provider is not None:
        if provider.account_sid:
            own["accountSid"] = provider.account_sid
        for field in ("authToken", "apiKey"):
            ref = sms_secret_ref(provider.provider_id, field)
            blob = tx.secrets.get(tenant_id, ref)
            if blob is not None:
                own[field] = runtime.box.open_bytes(blob, f"{tenant_id}/{ref}")
    return {k: v for k, v in {**install, **own}.items() if v}


def _install_base_url(runtime: Runtime, provider_type: str) -> str | None:
    if provider_type == "twilio":
        return runtime.config.sms.twilio.base_url or None
    if provider_type == "telnyx":
        return runtime.config.sms.telnyx.base_url or None
    return None


def _plan(runtime: Runtime, tenant_id: str, body: SmsSendBody) -> Plan:
    problems: list[str] = []
    tx = runtime.store.reader()
    with tx:  # one read transaction
        lead = tx.leads.get_lead(tenant_id, body.lead_id)
        if lead is None:
            raise NotFound()
        campaign_id = body.campaign_id or lead.campaign_id
        campaign = tx.catalog.get_campaign(tenant_id, campaign_id) if campaign_id else None
        if body.campaign_id is not None and campaign is None:
            problems.append("campaignId: unknown campaign")
        if body.interaction_id is not None:
            conversation = tx.messages.get_conversation(tenant_id, body.interaction_id)
            if conversation is None:
                problems.append("interactionId: unknown conversation")
            elif conversation.lead_id != lead.lead_id:
                problems.append("interactionId: the conversation belongs to another lead")
        recipient = body.to or lead.phone_e164 or (
            to_e164(lead.phone, lead.country or runtime.config.defaults.region) if lead.phone else None)
        if recipient is None:
            problems.append("to: required: the lead has no phone number on file")
        sms: SmsConfig | None = tx.catalog.get_sms_config(tenant_id)
        resolved_campaign = campaign.campaign_id if campaign is not None else None
        agent = campaign.campaign_ai_agents.rep if campaign is not None else None
        sender = sms_rules.resolve_sender(sms, resolved_campaign, agent.agent_id if agent else None, body.sender)
        if sender.number is None:
            problems.append("from: required: no SMS-capable number is configured for this tenant or campaign")
        if problems:
            raise ValidationFailed(problems)
        choice = sms_rules.resolve_provider(sms, resolved_campaign, runtime.config.sms.default_provider)
        assert recipient is not None and sender.number is not None
        since = tx.messages.opted_out_since(tenant_id, phone_hash(recipient))
        if since is not None:
            raise InvalidState([f"to: the recipient opted out of texts from this tenant on {since}"],
                               message="recipient opted out")
        found = credentials(runtime, tx, tenant_id, choice)
    return plan_of(runtime, tenant_id, lead.lead_id, recipient, sender.number, choice, found)


def plan_of(runtime: Runtime, tenant_id: str, lead_id: str | None, recipient: str, sender: str,
            choice: sms_rules.ProviderChoice, found: dict[str, str]) -> Plan:
    """A text to send: an API send's, or an answer to a lead's text from the number it wrote to."""
    own_url = choice.provider.base_url if choice.provider is not None else None
    return Plan(lead_id=lead_id, recipient=recipient, sender=sender, provider=choice, credentials=found,
                base_url=own_url or _install_base_url(runtime, choice.type), tenant_base_url=own_url is not None,
                status_callback_url=status_callback_url(runtime, tenant_id, choice.type))


async def deliver_reply(runtime: Runtime, registry: Registry, plan: Plan, text: str) -> tuple[str, str | None]:
    """(status, provider message id) of an answer sent through the provider."""
    result = await _deliver(runtime, registry, plan, text)
    status = "sent" if result.accepted else ("error" if result.status == "error" else "failed")
    return status, _scrubber(plan)(result.provider_message_id or None) if result.accepted else None


def _scrubber(plan: Plan) -> Scrubber:
    """Masks the provider's credentials (and the sid:token pair basic auth sends)."""
    secret_values = [v for k, v in plan.credentials.items() if k != "accountSid"]
    return Scrubber(secret_values, [(plan.credentials.get("accountSid"), v) for v in secret_values])


async def _deliver(runtime: Runtime, registry: Registry, plan: Plan, text: str) -> SmsResult:
    adapter = registry.sms_provider(plan.provider.type)
    if adapter is None:
        return SmsResult(accepted=False, status="error",
                         reason=f"SMS provider type {plan.provider.type!r} is not installed")
    if plan.tenant_base_url and plan.base_url and not runtime.config.delivery.allow_private_addresses:
        destination = await netguard.resolve_destination(plan.base_url, False)
        if destination.reason:
            return SmsResult(accepted=False, status="error" if destination.transient else "failed",
                             reason=f"provider baseUrl refused: {destination.reason}")
    message = SmsMessage(to=plan.recipient, sender=plan.sender, body=text, credentials=plan.credentials,
                         base_url=plan.base_url, settings=registry.adapter_settings("sms", plan.provider.type),
                         status_callback_url=plan.status_callback_url)
    try:
        async with http_client() as http:
            result = await adapter.send(message, http)
    except Exception as exc:  # a provider bug is an outage of that provider, never a 500
        crash = adapter_crash(exc, _scrubber(plan))
        log.error("SMS provider %r raised %s\n%s", adapter.name, crash.message, crash.stack)
        return SmsResult(accepted=False, status="error", reason=f"SMS provider failed: {crash.message}")
    if not isinstance(result, SmsResult):
        return SmsResult(accepted=False, status="error", reason="SMS provider returned no SmsResult")
    return result


async def send(runtime: Runtime, registry: Registry, tenant_id: str, body: SmsSendBody) -> SmsSendResult:
    problems: list[str] = []
    if body.to is not None and not sms_rules.is_e164(body.to):
        problems.append("to: must be an E.164 phone number, e.g. +14155552671")
    if body.sender is not None and (problem := sms_rules.sender_problem(body.sender)):
        problems.append(f"from: {problem}")
    if problems:
        raise ValidationFailed(problems)
    plan = _plan(runtime, tenant_id, body)
    segments = sms_rules.count_segments(body.message)
    now = iso(runtime.clock.now())
    message_id = new_id("msg")

    def open_unit(tx) -> str:
        if body.interaction_id is not None:
            conversation = tx.messages.get_conversation(tenant_id, body.interaction_id)
            if conversation is None or conversation.lead_id != plan.lead_id:
                raise ValidationFailed(["interactionId: unknown conversation"])
        else:
            conversation = tx.messages.open_conversation(tenant_id, plan.lead_id, plan.sender)
            if conversation is None:
                conversation = Conversation(
                    interaction_id=new_id("int"), lead_id=plan.lead_id, sender=plan.sender,
                    recipient=plan.recipient, status="open", message_count=0, created_at=now, updated_at=now)
                tx.messages.insert_conversation(tenant_id, conversation)
        tx.messages.insert_message(tenant_id, Message(
            message_id=message_id, interaction_id=conversation.interaction_id, lead_id=plan.lead_id,
            direction="outbound", sender=plan.sender, recipient=plan.recipient, body=body.message,
            encoding=segments.encoding, segments=segments.count, provider_id=plan.provider.provider_id,
            provider_type=plan.provider.type, provider_message_id=None, provider_status=None, status="sending",
            reason=None, created_at=now, updated_at=now))
        tx.messages.count_message(conversation.interaction_id, now)
        return conversation.interaction_id

    interaction_id = await runtime.store.write(open_unit, may_refuse=True)
    result = await _deliver(runtime, registry, plan, body.message)
    status = "sent" if result.accepted else ("error" if result.status == "error" else "failed")
    scrubber = _scrubber(plan)
    reason = None if result.accepted else scrubber(result.reason or "the provider did not accept the message")
    provider_message_id = scrubber(result.provider_message_id or None) if result.accepted else None
    finished = iso(runtime.clock.now())
    await runtime.store.write(lambda tx: tx.messages.finish_message(tenant_id, message_id, status=status, provider_message_id=provider_message_id,
        provider_status=scrubber(result.status), reason=reason, now=finished))
    if not result.accepted:
        raise ProviderError([reason or "", f"messageId: {message_id} stored with status {status}"])
    return SmsSendResult(
        message_id=message_id, status=status, interaction_id=interaction_id, lead_id=plan.lead_id,
        sender=plan.sender, to=plan.recipient, provider=plan.provider.type, provider_id=plan.provider.provider_id,
        provider_message_id=provider_message_id, segments=segments.count, encoding=segments.encoding,
        created_at=now)


class OptOutStatus(Model):
    """Whether texts to the phone are refused, and since when (the first STOP)."""

    opted_out: bool
    since: str | None


def opt_out_status(runtime: Runtime, tenant_id: str, phone: str) -> OptOutStatus:
    e164 = to_e164(phone, runtime.config.defaults.region)
    if e164 is None:
        raise ValidationFailed(["phone: not a phone number (E.164, e.g. +14155552671, or national in the install's"
                                " region)"])
    since = runtime.store.reader().messages.opted_out_since(tenant_id, phone_hash(e164))
    return OptOutStatus(opted_out=since is not None, since=since)


class OrphanMessageItem(Model):
    """A text from a number no lead of the tenant has, or the HELP answer sent back to one."""

    message_id: str
    direction: str
    sender: str = msgspec.field(name="from")
    to: str
    body: str
    status: str
    provider: str
    provider_id: str | None
    provider_message_id: str | None
    created_at: str


class OrphanMessagePage(Model):
    items: list[OrphanMessageItem]
    next_cursor: str | None
    has_more: bool


def orphan_messages(runtime: Runtime, tenant_id: str, before: str | None, limit: int) -> OrphanMessagePage:
    rows = runtime.store.reader().messages.orphans(tenant_id, before, limit + 1)
    items = [OrphanMessageItem(
        message_id=m.message_id, direction=m.direction, sender=m.sender, to=m.recipient, body=m.body, status=m.status,
        provider=m.provider_type, provider_id=m.provider_id, provider_message_id=m.provider_message_id,
        created_at=m.created_at) for m in rows[:limit]]
    more = len(rows) > limit
    return OrphanMessagePage(items=items, next_cursor=items[-1].message_id if more else None, has_more=more)
