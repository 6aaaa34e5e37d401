"""Campaign documents for e-signature: the `esign` job and the providers' callbacks.

A qualified lead of a campaign that sends documents gets an `esign` job instead of its `deliver`
job (domain/documents.first_job). The job, run by the claim loop (jobs/delivery.py), reconciles
the lead's documents with what is stored, each step written while it holds the job:
1. sends each applicable document not yet sent, in `order`, through its adapter; each becomes a
   file reference (`provider: esign_vendor`, `signingUrl`, `providerDocumentId`). A provider that
   is down leaves the lead at `pending` and the job tried again on the webhooks' schedule; a crash
   between the provider's answer and its record sends that document once more, no more (Documenso
   keeps no idempotency key; the `externalId` tells the two apart on its side);
2. fetches the signed file of each signed document and keeps it with its file reference;
3. decides (domain/documents.verdict, over the file references as stored in that unit): the lead
   waits at `document_sent` (the job sleeps until the earliest `expiresInDays` runs out), becomes
   `signed` and gets its `deliver` job, `failed` naming the document, or is held at
   `pending_action` when a required document could not be sent.

A callback (`POST /hooks/esign/<adapter>/<tenantId>`) moves one file reference forwards and wakes
the lead's job, which decides again. Unverified, unknown or unreadable callbacks change nothing
and are logged at WARNING with the tenant and the provider's document id only."""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import httpx
import msgspec

from appliance import sdk
from appliance.clock import Clock, iso
from appliance.domain.campaign import CampaignDocument
from appliance.domain.approval import holds_documents
from appliance.domain.documents import (
    ESIGN_JOB, FINAL, WAITING, Sent, adapter_of, applicable, expires_at, field_values, file_key_of, moves, verdict,
)
from appliance.domain.pipeline import event
from appliance.domain.submission import facts_of
from appliance.domain.webhooks import RETRY_SCHEDULE
from appliance.errors import NotFound, Unauthorized, ValidationFailed
from appliance.ids import new_id
from appliance.model import Model
from appliance.plugins import Registry
from appliance.runtime import Runtime
from appliance.adapters.outbound import Scrubber
from appliance.domain.lead import Submission
from appliance.services.delivery_attempt import Attempt, ClaimedWrite, settle
from appliance.services.files import FileReference, url_problem
from appliance.services.lead_updates import parse_iso
from appliance.services.users import base_url
from appliance.storage import Job, Session

log = logging.getLogger("appliance.esign")

DEFAULT_TIMEOUT_SECONDS = 10.0
DEADLINE_MARGIN = 2.0  # seconds beyond the adapter's own timeout before the job gives up on it
RETRY_HOURS = sum(RETRY_SCHEDULE) / 3600  # how long a provider is tried before the step gives up
_decode_reference = msgspec.json.Decoder(FileReference).decode
_encode = msgspec.json.Encoder().encode
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


class CallbackAnswer(Model):
    """What a provider's callback is answered (200)."""
    received: bool
    changed: bool
    status: str | None = None


# ---- the job ------------------------------------------------------------------------------------

async def run_documents(runtime: Runtime, registry: Registry, write: ClaimedWrite, job: Job, attempt: Attempt | None,
                        http: httpx.AsyncClient) -> None:
    clock = runtime.clock
    if attempt is None:
        await write(job, lambda tx: tx.jobs.finish(job.job_id, "dead", iso(clock.now()), "lead missing"))
        return
    campaign = attempt.settings.campaigns.get(attempt.submission.campaign.campaign_id)
    if campaign is None:
        await write(job, lambda tx: settle(tx, clock, attempt, None, "error", "campaign no longer exists",
                                           job_state="dead"))
        return
    documents = applicable(campaign, facts_of(attempt.lead), value_sets=attempt.settings.value_sets,
                           today=attempt.now.date())
    tenant_id, lead_id = job.tenant_id, job.lead_id
    references = _references(runtime.store.reader(), tenant_id, lead_id)

    for document in documents:
        # Only a lead still settling its documents is sent any, read again before each (a person
        # may have decided meanwhile; a late callback also wakes the job of a lead past them, to
        # keep a signed file).
        if not _settling(runtime.store.reader(), attempt):
            break
        key = file_key_of(document)
        stored = references.get(key)
        resume = stored.provider_document_id if stored is not None and _resumable(stored, document, attempt) \
            else None
        if stored is not None and resume is None and not _send_again(stored, document, attempt.submission):
            continue
        external_id = str(stored.reference.metadata.get("externalId")) if resume is not None else \
            f"{lead_id}/{key}" + ("" if stored is None else f"/{attempt.submission.submission_id}")
        sent = await _send(runtime, registry, attempt, document, external_id, resume, http)
        if resume is not None and sent.provider_document_id is None:
            # The document exists at the provider whatever this try came to: keep its id, so
            # its callbacks still find it.
            sent = msgspec.structs.replace(sent, provider_document_id=resume)
        if sent.outcome == "retry":
            reason = f"document {_name(document)} could not be sent: {sent.reason}"

            def later(tx: Session, sent: sdk.EsignSent = sent) -> None:
                if not _settling(tx, attempt):
                    _leave(tx, clock, attempt)
                    return
                if sent.provider_document_id:  # created at the provider: the next try sends that one
                    _record_sent(tx, runtime, attempt, document, key, external_id, sent)
                _try_later(tx, clock, attempt, reason, "pending")

            await write(job, later)
            return
        references[key] = await write(job, lambda tx: _record_sent(tx, runtime, attempt, document, key,
                                                                   external_id, sent))

    # Every signed document of the lead whose file is not kept yet, whichever campaign sent it (a
    # late signature after the lead moved on is kept too). A file that could not be fetched is
    # tried again for a new submission (the cause may be fixed).
    kept = runtime.store.reader().files.kept_ids(tenant_id, lead_id)
    for stored in list(references.values()):
        metadata = stored.reference.metadata
        if stored.reference.status != "signed" or stored.reference.file_id in kept \
                or (metadata.get("problem") and metadata.get("problemFor") == attempt.submission.submission_id):
            continue
        name = stored.reference.file_name
        fetched = await _fetch(runtime, registry, stored, http)
        if fetched.outcome == "retry" and not _fetch_given_up(stored.reference, attempt.now):
            reason = f"the signed file of document {name} could not be fetched: {fetched.reason}"
            await write(job, lambda tx: _try_later(tx, clock, attempt, reason, None))
            return
        if fetched.outcome == "retry":  # tried for a day and a half since it was signed: noted
            fetched = sdk.EsignFetched(outcome="failed", reason=f"{fetched.reason}; tried for {RETRY_HOURS:.0f} hours")
        await write(job, lambda tx: _record_fetched(tx, clock, attempt, stored.reference.file_key, fetched))

    await write(job, lambda tx: _conclude(tx, clock, attempt, documents))


def _name(document: CampaignDocument) -> str:
    return document.name or document.document_id


class Managed(NamedTuple):
    """A file reference this step wrote (its `esign_ref` set; the files API cannot change it),
    and the provider's id of its document as this step recorded it."""
    reference: FileReference
    provider_document_id: str | None


def _references(tx: Session, tenant_id: str, lead_id: str) -> dict[str, Managed]:
    """The lead's documents sent for e-signature by file key: only references this step wrote
    count (one a tenant posted under the same key is not a sent document)."""
    refs = tx.files.esign_refs_of(tenant_id, lead_id)
    found: dict[str, Managed] = {}
    for reference in map(_decode_reference, tx.files.docs_of(tenant_id, lead_id)):
        esign_ref = refs.get(reference.file_id)
        if esign_ref is not None:
            reference = msgspec.structs.replace(reference, metadata=reference.metadata or {})
            found[reference.file_key] = Managed(reference, esign_ref.partition(":")[2] or None)
    return found


def _settling(tx: Session, attempt: Attempt) -> bool:
    """Whether the job's lead is still settling its documents, as stored now: its latest
    submission is the job's, it waits on them (`qualified`, `pending`, `document_sent`), no
    human decision holds it, and no delivery is under way or made."""
    lead = tx.leads.get_lead(attempt.job.tenant_id, attempt.lead.lead_id)
    submission = tx.leads.get_submission(attempt.job.tenant_id, attempt.job.submission_id)
    return (lead is not None and submission is not None and lead.submission_count == submission.submission_number
            and lead.status in WAITING and not holds_documents(lead.approval)
            and submission.delivery is None and not tx.jobs.has_open_job(submission.submission_id, "deliver"))


def _leave(tx: Session, clock: Clock, attempt: Attempt) -> None:
    """The lead moved on while the job ran (a decision, a delivery, a resubmission): the job ends
    and leaves the lead as it is."""
    settle(tx, clock, attempt, None, None, "documents brought up to date", job_state="done",
           event_kind="documents_updated")


def _resumable(stored: Managed, document: CampaignDocument, attempt: Attempt) -> bool:
    """A document created at the provider whose sending could not be confirmed is finished by
    the next try: still unconfirmed (no callback moved it), for this same campaign document."""
    metadata = stored.reference.metadata
    return (metadata.get("unsent") is True and stored.reference.status == "pending"
            and stored.provider_document_id is not None and _same_document(metadata, document, attempt.submission))


def _same_document(metadata: dict[str, Any], document: CampaignDocument, submission: Submission) -> bool:
    return (metadata.get("campaignId", submission.campaign.campaign_id) == submission.campaign.campaign_id
            and metadata.get("signTemplateId") == document.sign_template_id)


def _fetch_given_up(reference: FileReference, now: datetime) -> bool:
    """A signed file is fetched for a day and a half after the signature, then noted as not
    fetched (the retries of the sending before do not count against it)."""
    signed = parse_iso(reference.signed_at) if reference.signed_at else None
    return signed is not None and now - signed[0] > timedelta(hours=RETRY_HOURS)


def _send_again(stored: Managed, document: CampaignDocument, submission: Submission) -> bool:
    """A document is sent once per lead. Sent again: one that ended declined, expired or failed
    for an earlier submission (a new submission is a new chance), and one sent for another
    campaign's document or template under the same id (a signature counts for what was signed)."""
    metadata = stored.reference.metadata or {}
    if not _same_document(metadata, document, submission):
        return metadata.get("submissionId") != submission.submission_id
    return stored.reference.status in ("declined", "expired", "failed") \
        and metadata.get("submissionId") != submission.submission_id


async def _send(runtime: Runtime, registry: Registry, attempt: Attempt, document: CampaignDocument,
                external_id: str, resume_id: str | None, http: httpx.AsyncClient) -> sdk.EsignSent:
    name = adapter_of(document)
    adapter = registry.esign_adapter(name)
    if adapter is None:
        return sdk.EsignSent(outcome="failed", reason=f"no e-signature adapter named {name!r} is loaded")
    if not document.sign_template_id:
        return sdk.EsignSent(outcome="failed", reason="the document has no signTemplateId")
    lead = attempt.lead
    if not lead.email:
        return sdk.EsignSent(outcome="failed", reason="the lead has no email to send the document to")
    settings = registry.adapter_settings("esign", name)
    timeout = _timeout(settings)
    request = sdk.EsignRequest(
        template_id=document.sign_template_id, title=_name(document), external_id=external_id,
        provider_document_id=resume_id,
        recipient_email=lead.email, recipient_name=" ".join(p for p in (lead.first_name, lead.last_name) if p) or None,
        fields=field_values(document.field_mapping_overrides, facts_of(lead), attempt.now.date()),
        settings=settings, timeout_seconds=timeout,
        allow_private_addresses=runtime.config.delivery.allow_private_addresses)
    try:
        sent = await asyncio.wait_for(adapter.send(request, http), timeout + DEADLINE_MARGIN)
    except TimeoutError:
        return sdk.EsignSent(outcome="retry", reason=f"{name} did not answer within {timeout:g} s")
    except Exception as exc:  # a plugin's bug: logged, and the document tried again later
        problem = registry.describe_error(exc, registry.plugin_of("esign", name))
        log.error("e-signature adapter %r raised %s", name, problem)
        return sdk.EsignSent(outcome="retry", reason=f"the {name} adapter failed ({problem.split(':', 1)[0]})")
    try:  # a plugin's struct is not type-checked when built: checked here, before anything is kept
        sent = msgspec.convert(msgspec.to_builtins(sent), sdk.EsignSent) if isinstance(sent, sdk.EsignSent) else None
    except (msgspec.ValidationError, TypeError) as exc:
        return sdk.EsignSent(outcome="failed", reason=f"the {name} adapter answered a bad result ({exc})")
    if sent is None:
        return sdk.EsignSent(outcome="failed", reason=f"the {name} adapter answered something other than EsignSent")
    sent = msgspec.structs.replace(sent, reason=_clean(sent.reason, settings, lead.email))
    if sent.outcome == "sent" and not sent.provider_document_id:
        return sdk.EsignSent(outcome="failed", reason=f"{name} answered without a document id")
    if sent.outcome == "sent" and sent.signing_url is not None and url_problem(sent.signing_url):
        return sdk.EsignSent(outcome="failed", reason=f"{name} answered a signing URL that is not an http(s) URL")
    return sent


async def _fetch(runtime: Runtime, registry: Registry, stored: Managed, http: httpx.AsyncClient) -> sdk.EsignFetched:
    name = str(stored.reference.metadata.get("adapter") or "")
    adapter = registry.esign_adapter(name)
    if adapter is None:
        return sdk.EsignFetched(outcome="failed", reason=f"no e-signature adapter named {name!r} is loaded")
    if not stored.provider_document_id:
        return sdk.EsignFetched(outcome="failed", reason="the provider's id of the document was not recorded")
    settings = registry.adapter_settings("esign", name)
    timeout = _timeout(settings)
    try:
        fetched = await asyncio.wait_for(adapter.fetch_signed(
            stored.provider_document_id, settings, http, timeout_seconds=timeout,
            allow_private_addresses=runtime.config.delivery.allow_private_addresses), timeout * 2 + DEADLINE_MARGIN)
    except TimeoutError:
        return sdk.EsignFetched(outcome="retry", reason=f"{name} did not answer within {timeout:g} s")
    except Exception as exc:  # a plugin's bug: logged, and tried again later
        problem = registry.describe_error(exc, registry.plugin_of("esign", name))
        log.error("e-signature adapter %r raised %s", name, problem)
        return sdk.EsignFetched(outcome="retry", reason=f"the {name} adapter failed ({problem.split(':', 1)[0]})")
    if not isinstance(fetched, sdk.EsignFetched) or fetched.outcome not in ("fetched", "retry", "failed") \
            or not isinstance(fetched.reason, (str, type(None))) or not isinstance(fetched.content_type, str) \
            or (fetched.outcome == "fetched" and not isinstance(fetched.content, bytes | bytearray)) \
            or (fetched.outcome == "fetched" and not fetched.content):
        return sdk.EsignFetched(outcome="failed", reason=f"{name} answered no file")
    return msgspec.structs.replace(fetched, reason=_clean(fetched.reason, settings, None),
                                   content=bytes(fetched.content) if fetched.content is not None else None)


def _clean(text: str | None, settings: dict[str, Any], email: str | None) -> str | None:
    """A plugin's words as they are kept and logged: no configured value (a token, a secret) and
    no lead's email in them, no control characters, at most 500 characters."""
    if text is None:
        return None
    scrub = Scrubber([v for v in settings.values() if isinstance(v, str)] + ([email] if email else []))
    return _CONTROL.sub(" ", scrub(text) or "")[:500]


def _timeout(settings: dict[str, Any]) -> float:
    value = settings.get("timeout_seconds")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 \
        else DEFAULT_TIMEOUT_SECONDS


def _try_later(tx: Session, clock: Clock, attempt: Attempt, reason: str, status: str | None) -> None:
    """The provider could not answer: tried again on the webhooks' schedule (about a day and a
    half), then the lead ends at `error`. `status`: what the lead waits at (None: as it is)."""
    now_dt = clock.now()
    attempts = attempt.job.attempts
    if attempts > len(RETRY_SCHEDULE) and status is not None:
        settle(tx, clock, attempt, None, "error", f"{reason}; the provider did not answer after {attempts} attempts",
               job_state="dead", event_kind="esign_error", details={"attempt": attempts})
        return
    due = iso(now_dt + timedelta(seconds=float(RETRY_SCHEDULE[min(attempts, len(RETRY_SCHEDULE)) - 1])))
    tx.jobs.reschedule(attempt.job.job_id, due, iso(now_dt), error=reason)
    settle(tx, clock, attempt, None, status, f"{reason}; retry {attempts + 1} at {due}", job_state=None,
           event_kind="esign_error", details={"attempt": attempts})


def _record_sent(tx: Session, runtime: Runtime, attempt: Attempt, document: CampaignDocument, key: str,
                 external_id: str, sent: sdk.EsignSent) -> Managed:
    clock = runtime.clock
    now_dt = clock.now()
    now = iso(now_dt)
    tenant_id, lead_id = attempt.job.tenant_id, attempt.lead.lead_id
    adapter = adapter_of(document)
    runs_out = expires_at(document, now_dt)
    metadata: dict[str, Any] = {
        "documentId": document.document_id, "adapter": adapter, "required": document.required,
        "campaignId": attempt.submission.campaign.campaign_id, "signTemplateId": document.sign_template_id,
        "submissionId": attempt.submission.submission_id, "externalId": external_id, "sentAt": now,
        "expiresAt": iso(runs_out) if runs_out is not None else None}
    if sent.outcome == "sent":
        status = "pending"
    elif sent.outcome == "retry":  # created at the provider, not yet known to be sent
        status, metadata["unsent"] = "pending", True
    else:
        status, metadata["problem"] = "failed", f"could not be sent: {sent.reason or 'the provider refused it'}"
    stored = tx.files.find(tenant_id, lead_id, key)
    previous = _decode_reference(stored) if stored is not None else None
    same = previous is not None and previous.provider_document_id is not None \
        and previous.provider_document_id == sent.provider_document_id
    if same and previous.status != "pending":  # its callbacks came first: they had the last word
        status = previous.status
        metadata.pop("unsent", None)
        metadata.update({k: v for k, v in (previous.metadata or {}).items() if k == "reason"})
    if previous is not None and not same:
        tx.files.drop_content(tenant_id, previous.file_id)  # another document's signed file
    reference = FileReference(
        file_id=previous.file_id if previous else new_id("file"), lead_id=lead_id, file_key=key,
        file_name=_name(document), file_type="pdf", document_url=content_url(runtime, lead_id, key),
        signing_url=sent.signing_url if sent.outcome == "sent" else previous.signing_url if same and previous else None,
        status=status, provider="esign_vendor",
        provider_document_id=sent.provider_document_id, metadata=metadata,
        signed_at=previous.signed_at if same and previous is not None else None,
        created_at=previous.created_at if previous else now, updated_at=now)
    # Marks the reference as this step's (the files API leaves it alone), with the provider's id.
    esign_ref = f"{adapter}:{sent.provider_document_id or ''}"
    if previous is None:
        tx.files.insert(tenant_id, file_id=reference.file_id, lead_id=lead_id, file_key=key, created_at=now,
                        doc=_encode(reference), esign_ref=esign_ref)
    else:
        tx.files.update(tenant_id, file_id=reference.file_id, updated_at=now, doc=_encode(reference))
        tx.files.set_esign_ref(tenant_id, reference.file_id, esign_ref)
    details = {"documentId": document.document_id, "fileKey": key, "providerDocumentId": sent.provider_document_id}
    if sent.outcome == "retry":
        return Managed(reference, sent.provider_document_id)
    if sent.outcome == "sent":
        settle(tx, clock, attempt, None, None, f"document {_name(document)} sent for signature", job_state=None,
               event_kind="document_sent", details=details)
    else:
        settle(tx, clock, attempt, None, None, f"document {_name(document)} {metadata['problem']}",
               job_state=None, event_kind="document_failed", details=details)
    return Managed(reference, sent.provider_document_id)


def content_url(runtime: Runtime, lead_id: str, key: str) -> str:
    """Where the document's file is read once it is kept (404 until then)."""
    return f"{base_url(runtime)}/api/v1/files/{lead_id}/{key}/content"


def _record_fetched(tx: Session, clock: Clock, attempt: Attempt, key: str, fetched: sdk.EsignFetched) -> None:
    now = iso(clock.now())
    tenant_id, lead_id = attempt.job.tenant_id, attempt.lead.lead_id
    stored = tx.files.find(tenant_id, lead_id, key)
    if stored is None:
        return
    reference = _decode_reference(stored)
    metadata = dict(reference.metadata or {})
    name, document_id = reference.file_name, metadata.get("documentId")
    if fetched.outcome == "fetched" and fetched.content:
        # Served back to browsers (the console's download): a PDF, or bytes, never a page.
        content_type = "application/pdf" if fetched.content_type.split(";")[0].strip().lower() == "application/pdf" \
            else "application/octet-stream"
        tx.files.keep_content(tenant_id, reference.file_id, content_type, fetched.content, now)
        metadata["fetchedAt"], metadata["size"] = now, len(fetched.content)
        metadata.pop("problem", None)
        metadata.pop("problemFor", None)
        reason, kind = f"the signed file of document {name} is kept", "document_fetched"
    else:
        metadata["problem"] = f"was signed but its file could not be fetched: {fetched.reason}"
        metadata["problemFor"] = attempt.submission.submission_id
        reason, kind = f"the signed file of document {name} could not be fetched: {fetched.reason}", \
            "document_fetch_failed"
    tx.files.update(tenant_id, file_id=reference.file_id, updated_at=now,
                    doc=_encode(msgspec.structs.replace(reference, metadata=metadata, updated_at=now)))
    settle(tx, clock, attempt, None, None, reason, job_state=None, event_kind=kind,
           details={"documentId": document_id, "fileKey": key})


def _conclude(tx: Session, clock: Clock, attempt: Attempt, documents: list[CampaignDocument]) -> None:
    """What the lead's documents come to, from the file references as stored in this unit (a
    callback may have moved one since the job read them)."""
    now_dt = clock.now()
    now = iso(now_dt)
    tenant_id, lead_id, job = attempt.job.tenant_id, attempt.lead.lead_id, attempt.job
    references = _references(tx, tenant_id, lead_id)
    kept = tx.files.kept_ids(tenant_id, lead_id)
    sent: list[Sent] = []
    for document in documents:
        stored = references.get(file_key_of(document))
        if stored is None:
            continue
        reference = stored.reference
        metadata = reference.metadata or {}
        sent.append(Sent(document.document_id, _name(document), document.required, reference.status,
                         metadata.get("expiresAt"), metadata.get("problem"), metadata.get("reason"),
                         reference.file_id in kept))
    decided = verdict(sent, now)
    for document in documents:
        if document.document_id in decided.expired:
            _expire(tx, clock, now, attempt, references[file_key_of(document)].reference, document)
    if decided.outcome == "fetch":  # signed since the fetch step: fetch it now
        tx.jobs.reschedule(job.job_id, now, now, keep_attempts=True)
        return
    if not _settling(tx, attempt):
        # Past its documents (on to delivery, decided by a person, or resubmitted): a document
        # signed late is kept, and the lead is left as it is.
        _leave(tx, clock, attempt)
        return
    stored = tx.leads.get_lead(tenant_id, lead_id)
    assert stored is not None  # _settling read it in this unit
    if decided.outcome in ("held", "failed"):
        settle(tx, clock, attempt, None, "pending_action" if decided.outcome == "held" else "failed",
               decided.reason or decided.outcome, job_state="done", event_kind=f"documents_{decided.outcome}")
        return
    if decided.outcome in ("signed", "deliver"):
        reason = decided.reason or "documents sent; none must be signed before delivery"
        # A lead that waited for its provider at `pending` goes on as what it was: qualified.
        status = "signed" if decided.outcome == "signed" else \
            "qualified" if stored.status in ("pending", "document_sent") else None
        settle(tx, clock, attempt, None, status, reason, job_state="done", event_kind="delivery_scheduled")
        if tx.jobs.job_state(job.job_id) == "done":  # not cancelled by a person meanwhile
            tx.jobs.insert_job(tenant_id=tenant_id, kind="deliver", lead_id=lead_id,
                               submission_id=job.submission_id, due_at=now, now=now)
        return
    if decided.wake_at is not None:
        tx.jobs.reschedule(job.job_id, decided.wake_at, now, keep_attempts=True)
        settle(tx, clock, attempt, None, "document_sent", decided.reason or "waiting", job_state=None,
               event_kind="waiting_for_signature", details={"until": decided.wake_at})
    else:
        settle(tx, clock, attempt, None, "document_sent", decided.reason or "waiting", job_state="done",
               event_kind="waiting_for_signature")


def _expire(tx: Session, clock: Clock, now: str, attempt: Attempt, reference: FileReference,
            document: CampaignDocument) -> None:
    tenant_id = attempt.job.tenant_id
    tx.files.update(tenant_id, file_id=reference.file_id, updated_at=now,
                    doc=_encode(msgspec.structs.replace(reference, status="expired", updated_at=now)))
    settle(tx, clock, attempt, None, None, f"document {_name(document)} expired unsigned", job_state=None,
           event_kind="document_expired", details={"documentId": document.document_id, "fileKey": reference.file_key})


# ---- callbacks ----------------------------------------------------------------------------------

async def receive_callback(runtime: Runtime, registry: Registry, adapter_name: str, tenant_id: str,
                     headers: dict[str, str], body: bytes) -> tuple[CallbackAnswer, bool]:
    """Check and apply one provider callback: (the answer, whether the lead's job was woken)."""
    adapter = registry.esign_adapter(adapter_name)
    if adapter is None:
        log.warning("e-signature callback for an unknown adapter (%d bytes)", len(body))
        raise NotFound()
    settings = registry.adapter_settings("esign", adapter_name)
    try:  # first: without the provider's secret, nothing is told, not even whether a tenant exists
        verified = bool(adapter.verify_callback(headers, body, settings))
    except Exception as exc:  # a plugin's bug counts as unverified
        log.error("e-signature adapter %r: verify_callback raised %s", adapter_name,
                  registry.describe_error(exc, registry.plugin_of("esign", adapter_name)))
        verified = False
    if not verified:
        log.warning("e-signature callback from %s for tenant %s refused: not verified", adapter_name, tenant_id)
        raise Unauthorized(challenge=f'{adapter_name} realm="appliance"')
    if not runtime.store.reader().tenants.tenant_exists(tenant_id):
        log.warning("e-signature callback from %s for an unknown tenant", adapter_name)
        raise NotFound()
    try:
        read = adapter.read_callback(body)
    except Exception as exc:  # a plugin's bug: the body is taken as unreadable
        log.error("e-signature adapter %r: read_callback raised %s", adapter_name,
                  registry.describe_error(exc, registry.plugin_of("esign", adapter_name)))
        read = None
    try:  # a plugin's struct is not type-checked when built
        read = msgspec.convert(msgspec.to_builtins(read), sdk.EsignCallback) \
            if isinstance(read, sdk.EsignCallback) else None
    except (msgspec.ValidationError, TypeError):
        read = None
    if read is None or not read.provider_document_id:
        log.warning("e-signature callback from %s for tenant %s refused: unreadable body", adapter_name, tenant_id)
        raise ValidationFailed([f"body: not a {adapter_name} callback this appliance can read"])
    reason = _clean(read.reason, settings, None)
    esign_ref = f"{adapter_name}:{read.provider_document_id}"
    now = iso(runtime.clock.now())

    def unit(tx: Session) -> tuple[CallbackAnswer, bool] | None:
        found = tx.files.find_by_esign_ref(tenant_id, esign_ref)
        if found is None:
            return None
        lead_id, doc = found
        reference = _decode_reference(doc)
        if read.status is None or not moves(reference.status, read.status):
            return CallbackAnswer(received=True, changed=False, status=reference.status), False
        metadata = dict(reference.metadata or {})
        metadata.pop("unsent", None)  # the provider speaks of it: it was sent
        if reason:
            metadata["reason"] = reason
        moved = msgspec.structs.replace(reference, status=read.status, updated_at=now, metadata=metadata,
                                        signed_at=now if read.status == "signed" else reference.signed_at)
        tx.files.update(tenant_id, file_id=reference.file_id, updated_at=now, doc=_encode(moved))
        # The lead's latest submission settles its documents (one set per lead, whichever
        # submission sent them).
        submission = tx.leads.latest_submission(tenant_id, lead_id)
        woken = False
        if submission is not None:
            tx.leads.update_submission(tenant_id, msgspec.structs.replace(
                submission, updated_at=now, journey_events=[
                    *submission.journey_events,
                    event(now, f"document_{read.status}", f"document {reference.file_name} is {read.status}",
                          details={"documentId": metadata.get("documentId"), "fileKey": reference.file_key,
                                   "providerDocumentId": reference.provider_document_id})]))
            # A final status: the job decides again (or, past the documents, keeps a signed file).
            # A submission still being evaluated gets its documents job from its evaluation.
            if read.status in FINAL and not tx.jobs.has_open_job(submission.submission_id, "evaluate"):
                woken = tx.jobs.wake_waiting(submission.submission_id, ESIGN_JOB, now) > 0
                if not woken and not tx.jobs.has_open_job(submission.submission_id, ESIGN_JOB):
                    tx.jobs.insert_job(tenant_id=tenant_id, kind=ESIGN_JOB, lead_id=lead_id,
                                       submission_id=submission.submission_id, due_at=now, now=now)
                    woken = True
        return CallbackAnswer(received=True, changed=True, status=read.status), woken

    answered = await runtime.store.write(unit)
    if answered is None:
        log.warning("e-signature callback from %s for tenant %s names a document it does not have", adapter_name,
                    tenant_id)
        raise NotFound()
    return answered

