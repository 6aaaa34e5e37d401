"""POST /hooks/sms/{provider}/{tenantId}: the provider's webhooks, replies and delivery reports.

Order of work:
1. The provider (404 for a type no adapter has), the body's size (413 over 64 KiB, before any
   signature is computed) and the tenant's credentials for it: one set per
   provider of that type in the tenant's `sms` configuration (its own fields, each missing one
   taken from the install-wide `[sms.<type>]` table), then the install-wide set. An unknown
   tenant is refused like a bad signature (403), so an unsigned call learns nothing.
2. The signature, by the adapter (Twilio: HMAC-SHA1 over the URL and the sorted form; Telnyx:
   Ed25519 over timestamp and body, with a replay window). Missing, wrong or replayed: 403,
   nothing stored, a WARNING without the message's text or phone.
3. The events (400 for a body the adapter cannot read). A reply verified only by the install-wide
   credentials (which every tenant without its own shares) must be addressed to a number of this
   tenant (its `sms.numbers`, its agents' numbers or a number it has texted from): else 403, so a
   signed call cannot be replayed onto another tenant's path.
4. One write: a reply joins the conversation of the tenant's latest lead with the sender's phone
   (its open conversation from the number written to, else a new one), or is kept as an orphan
   message of the tenant when no lead has that phone; a provider's retry of a message already
   kept changes nothing. STOP-like keywords opt the phone out (its SHA-256 digest, as suppression
   entries), START / UNSTOP opt it back in, HELP / INFO are answered with the tenant's
   `sms.helpText`. A delivery report moves its outbound message's status forward, never back.
5. The answer: the adapter's (Twilio's TwiML, carrying the HELP text), else `{"received": true}`
   and the HELP text is sent through the provider after the answer, stored like any message.
"""

from __future__ import annotations

import inspect
import logging
import re
from dataclasses import dataclass
import msgspec

from appliance.adapters.outbound import Scrubber
from appliance.clock import iso
from appliance.domain import sms_rules
from appliance.domain.messaging import SmsConfig
from appliance.domain.normalize import to_e164
from appliance.domain.suppression import phone_hash
from appliance.errors import Forbidden, NotFound, PayloadTooLarge, ValidationFailed
from appliance.ids import new_id
from appliance.plugins import Registry
from appliance.runtime import Runtime
from appliance.sdk import SmsEvent, SmsProvider, SmsWebhook, SmsWebhookAnswer
from appliance.services import sms
from appliance.storage import Conversation, Message, OrphanMessage, Session

log = logging.getLogger("appliance.services.sms")

# A provider's webhook is a few KiB (a text is at most 1600 characters); a larger body is refused
# before any signature is checked, so an unsigned one costs no more than that to refuse.
MAX_BODY = 64 * 1024

_RECEIVED = SmsWebhookAnswer(content_type="application/json", body=b'{"success":true,"data":{"received":true}}')


@dataclass(frozen=True)
class _Signer:
    """One set of credentials a webhook may be signed with."""

    provider: sms_rules.ProviderChoice
    credentials: dict[str, str]
    shared: bool  # the install-wide set


@dataclass(frozen=True)
class Reply:
    """A HELP answer to send through the provider once the webhook is answered."""

    tenant_id: str
    message_id: str
    orphan: bool
    plan: sms.Plan
    text: str


def _signers(runtime: Runtime, tx: Session, tenant_id: str, provider_type: str,
             config: SmsConfig | None) -> list[_Signer]:
    own = [p for p in (config.providers if config is not None else []) if p.type == provider_type]
    found = []
    for provider in own:
        choice = sms_rules.ProviderChoice("tenant_default", provider.type, provider.provider_id, provider)
        credentials = sms.credentials(runtime, tx, tenant_id, choice)
        if provider.public_key:
            credentials["publicKey"] = provider.public_key
        if credentials:  # an empty set is no set: a naive plugin may take "" for its secret
            found.append(_Signer(choice, credentials, shared=False))
    install = sms.credentials(runtime, tx, tenant_id, sms_rules.ProviderChoice("builtin", provider_type))
    if provider_type == "telnyx" and runtime.config.sms.telnyx.public_key:
        install["publicKey"] = runtime.config.sms.telnyx.public_key
    if install:
        found.append(_Signer(sms_rules.ProviderChoice("builtin", provider_type), install, shared=True))
    return found


def _plugin_bug(registry: Registry, adapter: SmsProvider, method: str, exc: Exception,
                signers: list[_Signer]) -> None:
    """Logs a provider's exception naming its plugin, every credential the webhook could be
    checked with masked (a plugin may put one in its message)."""
    plugin = registry.plugin_of("sms", adapter.name)
    scrub = Scrubber([v for s in signers for k, v in s.credentials.items() if k not in ("accountSid", "publicKey")])
    log.error("SMS provider %r (plugin %r): %s raised %s", adapter.name, plugin, method,
              scrub(registry.describe_error(exc, plugin)))


def _verify(registry: Registry, adapter: SmsProvider, webhook: SmsWebhook, signers: list[_Signer]) -> _Signer | None:
    for signer in signers:
        try:  # a plugin's bug counts as unverified
            verified = adapter.verify_webhook(msgspec.structs.replace(webhook, credentials=[signer.credentials]))
        except Exception as exc:
            _plugin_bug(registry, adapter, "verify_webhook", exc, signers)
            return None
        if inspect.isawaitable(verified):  # an `async def`: its coroutine, never awaited, is no True
            getattr(verified, "close", lambda: None)()
            _plugin_bug(registry, adapter, "verify_webhook", TypeError("verify_webhook must be a plain function, "
                                                                       "not async: it answered an awaitable"), signers)
            return None
        if verified is True:  # only True verifies: a truthy object (a dict, a string) is a bug
            return signer
    return None


def _events(registry: Registry, adapter: SmsProvider, webhook: SmsWebhook,
            signers: list[_Signer]) -> list[SmsEvent] | None:
    try:
        read = adapter.read_webhook(webhook)
    except Exception as exc:  # a plugin's bug: the body is taken as unreadable
        _plugin_bug(registry, adapter, "read_webhook", exc, signers)
        return None
    if not isinstance(read, list):
        return None
    try:  # a plugin's structs are not type-checked when built
        return [_storable(msgspec.convert(msgspec.to_builtins(event), SmsEvent)) for event in read]
    except (msgspec.ValidationError, TypeError):
        return None


# What no database column can hold: a NUL (PostgreSQL's text) and a lone surrogate (not UTF-8; a
# provider's JSON may escape one, `"\ud83d"`, when a handset split an emoji).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _storable(event: SmsEvent) -> SmsEvent:
    """The event with each character no database can hold replaced by U+FFFD: a text is kept on
    both backends alike, never refused (its provider would retry it in vain) nor a 500."""
    fields = ("provider_message_id", "sender", "to", "body", "provider_status", "reason")
    bad = {f: _UNSTORABLE.sub("\ufffd", v) for f in fields
           if isinstance(v := getattr(event, f), str) and _UNSTORABLE.search(v)}
    return msgspec.structs.replace(event, **bad) if bad else event


def _answer(registry: Registry, adapter: SmsProvider, reply: str | None,
            signers: list[_Signer]) -> SmsWebhookAnswer | None:
    try:
        answer = adapter.webhook_answer(reply)
    except Exception as exc:  # a plugin's bug: the default answer, the reply sent through `send`
        _plugin_bug(registry, adapter, "webhook_answer", exc, signers)
        return None
    return answer if isinstance(answer, SmsWebhookAnswer) else None


def _tenant_numbers(config: SmsConfig | None) -> set[str]:
    if config is None:
        return set()
    return {n.number for n in config.numbers} | {a.number for a in config.agents}


async def receive(runtime: Runtime, registry: Registry, provider_type: str, tenant_id: str, url: str,
                  headers: dict[str, str], body: bytes) -> tuple[SmsWebhookAnswer, Reply | None]:
    """Check and apply one webhook: (the answer, a HELP text still to send through the provider)."""
    adapter = registry.sms_provider(provider_type)
    if adapter is None:
        log.warning("SMS webhook for an unknown provider type (%d bytes)", len(body))
        raise NotFound()
    if len(body) > MAX_BODY:
        log.warning("SMS webhook from %s refused: its body of %d bytes is over %d", provider_type, len(body), MAX_BODY)
        raise PayloadTooLarge(message=f"An SMS webhook's body is at most {MAX_BODY // 1024} KiB")
    tx = runtime.store.reader()
    with tx:
        known = tx.tenants.tenant_exists(tenant_id)
        config = tx.catalog.get_sms_config(tenant_id) if known else None
        signers = _signers(runtime, tx, tenant_id, provider_type, config) if known else []
    webhook = SmsWebhook(url=url, headers=headers, body=body, credentials=[],
                         settings=registry.adapter_settings("sms", provider_type), now=runtime.clock.now())
    signer = _verify(registry, adapter, webhook, signers)
    if signer is None:
        log.warning("SMS webhook from %s for tenant %s refused: signature missing, wrong or replayed",
                    provider_type, tenant_id if known else "(unknown)")
        raise Forbidden(message="The webhook's signature could not be verified")
    events = _events(registry, adapter, msgspec.structs.replace(webhook, credentials=[signer.credentials]), signers)
    if events is None:
        log.warning("SMS webhook from %s for tenant %s refused: unreadable body", provider_type, tenant_id)
        raise ValidationFailed([f"body: not a {provider_type} webhook this appliance can read"])
    inbound = [e for e in events if e.kind == "inbound"]
    if signer.shared and inbound:
        numbers = _tenant_numbers(config)
        foreign = [e for e in inbound if e.to not in numbers]
        if foreign and not all(e.to and runtime.store.reader().messages.sends_from(tenant_id, e.to) for e in foreign):
            log.warning("SMS webhook from %s for tenant %s refused: addressed to a number not of this tenant",
                        provider_type, tenant_id)
            raise Forbidden(message="The message is not addressed to a number of this tenant")
    help_text = config.help_text if config is not None else None
    asks_help = help_text is not None and any(
        sms_rules.keyword_of(e.body or "") == "help" for e in inbound)
    answer = _answer(registry, adapter, help_text if asks_help else None, signers)
    answered_in_place = asks_help and answer is not None
    now = iso(runtime.clock.now())
    region = runtime.config.defaults.region

    def unit(tx: Session) -> Reply | None:
        reply = None
        for event in events:
            if event.kind == "status":
                _report(tx, tenant_id, provider_type, event, now)
                continue
            helped = _keep_inbound(tx, tenant_id, provider_type, signer, event, region, now)
            if helped is not None and asks_help and reply is None and sms_rules.keyword_of(event.body or "") == "help":
                reply = _keep_reply(runtime, tx, tenant_id, signer, helped, help_text or "", answered_in_place, now)
        return reply

    reply = await runtime.store.write(unit)
    return (answer if answer is not None else _RECEIVED), (None if answered_in_place else reply)


@dataclass(frozen=True)
class _Kept:
    """Where an inbound message went: its lead's conversation, or the orphans."""

    lead_id: str | None
    interaction_id: str | None
    phone: str      # the lead's number, as it wrote
    number: str     # the tenant's number it wrote to


def _keep_inbound(tx: Session, tenant_id: str, provider_type: str, signer: _Signer, event: SmsEvent,
                  region: str | None, now: str) -> _Kept | None:
    """Stores an inbound message and applies its keyword; None when it was kept before (a retry).
    The sender's phone is read as a lead's is: E.164, or national in the install's region (a
    plugin's provider may give one so), so its STOP and its lead are found all the same."""
    if tx.messages.by_provider_id(tenant_id, provider_type, event.provider_message_id, "inbound") is not None \
            or tx.messages.orphan_exists(tenant_id, provider_type, event.provider_message_id):
        return None
    sender, number, text = event.sender or "", event.to or "", event.body or ""
    phone = to_e164(sender, region)
    keyword = sms_rules.keyword_of(text)
    if phone is not None and keyword == "stop":
        tx.messages.opt_out(tenant_id, phone_hash(phone), text.strip().upper(), now)
    elif phone is not None and keyword == "start":
        tx.messages.opt_in(tenant_id, phone_hash(phone))
    lead_id = tx.leads.latest_lead_with_phone(tenant_id, phone) if phone is not None else None
    provider_id = signer.provider.provider_id
    if lead_id is None:
        tx.messages.insert_orphan(tenant_id, OrphanMessage(
            message_id=new_id("msg"), direction="inbound", sender=sender, recipient=number, body=text,
            provider_id=provider_id, provider_type=provider_type, provider_message_id=event.provider_message_id,
            status="received", created_at=now))
        return _Kept(None, None, sender, number)
    conversation = _conversation(tx, tenant_id, lead_id, number, sender, now)
    segments = sms_rules.count_segments(text)
    tx.messages.insert_message(tenant_id, Message(
        message_id=new_id("msg"), interaction_id=conversation, lead_id=lead_id, direction="inbound",
        sender=sender, recipient=number, body=text, encoding=segments.encoding, segments=segments.count,
        provider_id=provider_id, provider_type=provider_type, provider_message_id=event.provider_message_id,
        provider_status="received", status="received", reason=None, created_at=now, updated_at=now))
    tx.messages.count_message(conversation, now)
    return _Kept(lead_id, conversation, sender, number)


def _conversation(tx: Session, tenant_id: str, lead_id: str, number: str, phone: str, now: str) -> str:
    """The lead's open conversation from the tenant's `number`, else a new one."""
    found = tx.messages.open_conversation(tenant_id, lead_id, number)
    if found is not None:
        return found.interaction_id
    interaction_id = new_id("int")
    tx.messages.insert_conversation(tenant_id, Conversation(
        interaction_id=interaction_id, lead_id=lead_id, sender=number, recipient=phone, status="open",
        message_count=0, created_at=now, updated_at=now))
    return interaction_id


def _keep_reply(runtime: Runtime, tx: Session, tenant_id: str, signer: _Signer, kept: _Kept, text: str,
                answered_in_place: bool, now: str) -> Reply:
    """Stores the HELP answer beside the question: `sent` when the webhook's answer carries it,
    else `sending` until the provider takes it."""
    status = "sent" if answered_in_place else "sending"
    message_id = new_id("msg")
    provider = signer.provider
    if kept.lead_id is None or kept.interaction_id is None:
        tx.messages.insert_orphan(tenant_id, OrphanMessage(
            message_id=message_id, direction="outbound", sender=kept.number, recipient=kept.phone, body=text,
            provider_id=provider.provider_id, provider_type=provider.type, provider_message_id=None,
            status=status, created_at=now))
    else:
        segments = sms_rules.count_segments(text)
        tx.messages.insert_message(tenant_id, Message(
            message_id=message_id, interaction_id=kept.interaction_id, lead_id=kept.lead_id, direction="outbound",
            sender=kept.number, recipient=kept.phone, body=text, encoding=segments.encoding,
            segments=segments.count, provider_id=provider.provider_id, provider_type=provider.type,
            provider_message_id=None, provider_status=None, status=status, reason=None, created_at=now,
            updated_at=now))
        tx.messages.count_message(kept.interaction_id, now)
    return Reply(tenant_id=tenant_id, message_id=message_id, orphan=kept.lead_id is None,
                 plan=sms.plan_of(runtime, tenant_id, kept.lead_id, kept.phone, kept.number, provider,
                                     signer.credentials), text=text)


def _report(tx: Session, tenant_id: str, provider_type: str, event: SmsEvent, now: str) -> None:
    """A delivery report: the outbound message it names moves forward (an unknown id, such as a
    report that outran the send's own answer, changes nothing)."""
    if event.status is None:
        return
    found = tx.messages.by_provider_id(tenant_id, provider_type, event.provider_message_id, "outbound")
    if found is None or not sms_rules.report_moves(found.status, event.status):
        return
    tx.messages.report_status(tenant_id, found.message_id, status=event.status,
                              provider_status=(event.provider_status or event.status)[:32],
                              reason=(event.reason or None) and event.reason[:500], now=now)


async def send_reply(runtime: Runtime, registry: Registry, reply: Reply) -> None:
    """Sends a HELP answer through the provider (after the webhook was answered) and records how
    it went; a failure is logged, the lead's number never."""
    status, provider_message_id = await sms.deliver_reply(runtime, registry, reply.plan, reply.text)
    if reply.orphan:
        await runtime.store.write(lambda tx: tx.messages.finish_orphan(
            reply.tenant_id, reply.message_id, status, provider_message_id))
    else:
        await runtime.store.write(lambda tx: tx.messages.finish_message(
            reply.tenant_id, reply.message_id, status=status, provider_message_id=provider_message_id,
            provider_status=status, reason=None if status == "sent" else "the provider did not take the HELP answer",
            now=iso(runtime.clock.now())))
    if status != "sent":
        log.warning("HELP answer %s for tenant %s not sent: %s", reply.message_id, reply.tenant_id, status)
