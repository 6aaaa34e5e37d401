"""POST /api/v1/leads/ping behind the HTTP layer: a supplier asks what a lead would be paid
before it posts it. The partial lead goes through the submit's checks on what it carries (the
source, its ping limits and caps, the duplicate check, by digest when the contact is hashed,
routing and qualification); an auction campaign then holds a round with it, and the answer
offers the winning bids less the campaign's margin (else the source's fixed `payout`). The ping,
and its round with the winners it reserves, are stored in one transaction; the lead posted later
with the `pingId` is sold to those winners at their bids without another round (intake.submit
takes the ping, services/delivery.py sells it)."""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
import msgspec

from appliance.clock import iso
from appliance.domain import caps as caps_rules
from appliance.domain.auction import AuctionRecord, payout, ranked
from appliance.domain.campaign import Auction, Campaign, IngestionSource, sells_at_auction
from appliance.domain.constraints import campaign_zone
from appliance.domain.contact_hash import sha256_hex
from appliance.domain.dedupe import effective_policy, find_duplicate, window_start
from appliance.domain.pipeline import attestation_problem, evaluate
from appliance.domain.submission import PingLead, build_lead, facts_of
from appliance.errors import RateLimited, ValidationFailed
from appliance.ids import new_id
from appliance.model import Model
from appliance.plugins import Registry
from appliance.runtime import Runtime
from appliance.services.auction import Bidder, hold_round
from appliance.services.buyer_choice import auction_field, take_room
from appliance.services.intake import CapCheck, resolve_campaign, source_cap_checks
from appliance.services.opened_endpoints import OpenedEndpoints
from appliance.services.tenant_settings import TenantSettings
from appliance.storage import Principal, PingRecord, Session

FIXED_PAYOUT_TTL_SECONDS = 60  # how long a fixed payout offer stands (a campaign that does not auction)


class PingAnswer(Model):
    ping_id: str
    accepted: bool
    bid: float | None
    currency: str
    expires_at: str
    reason: str | None


def ping_limit_checks(campaign: Campaign, source: IngestionSource | None, now: datetime) -> list[tuple[CapCheck, datetime]]:
    """The source's ping limits, each with the end of its current period (for Retry-After)."""
    if source is None:
        return []
    zone = caps_rules.zone(campaign_zone(campaign))
    checks = []
    for limit in source.ping_limits:
        if limit.type == "per_minute":
            start = now.replace(second=0, microsecond=0)
            end = start + timedelta(minutes=1)
        else:
            start, end = caps_rules.period_bounds(limit.type, now, zone)
        checks.append((CapCheck(scope=f"ping:{campaign.campaign_id}:{source.source_id}:{limit.type}",
                                period_start=iso(start), cap=limit.cap, label=f"{limit.type} ping limit of {limit.cap}"),
                       end))
    return checks


def _over_limit(tx: Session, tenant_id: str, limits: list[tuple[CapCheck, datetime]], now: datetime) -> None:
    for check, end in limits:
        if tx.caps.counter_value(tenant_id, check.scope, check.period_start) >= check.cap:
            raise RateLimited(retry_after=max(1, int((end - now).total_seconds() + 0.999)),
                              message=f"Too many pings from this source: its {check.label} is reached")


async def ping(runtime: Runtime, settings: TenantSettings, principal: Principal, body: PingLead, registry: Registry,
               http: httpx.AsyncClient, endpoints: OpenedEndpoints) -> PingAnswer:
    tenant_id = principal.tenant_id
    intake, source = resolve_campaign(settings, body.campaign_id, principal)
    now_dt = runtime.clock.now()
    now = iso(now_dt)
    lead, problems = build_lead(body, lead_id="ping", existing=None, labels=settings.labels,
                                region=runtime.config.defaults.region, now=now, partial=True)
    if source is not None:
        lead = msgspec.structs.replace(lead, source_id=source.source_id)
    if problems:
        raise ValidationFailed(problems)
    facts = facts_of(lead)
    limits = ping_limit_checks(intake, source, now_dt)
    reader = runtime.store.reader()
    ping_id = new_id("png")
    with reader:  # one read transaction: SQLite starts each statement outside one with a cold page cache
        _over_limit(reader, tenant_id, limits, now_dt)
        refused = _refused_at_intake(reader, runtime, tenant_id, intake, source, body, lead, now_dt)
    campaign, record, offered, currency = intake, None, None, "USD"
    expires = now_dt + timedelta(seconds=FIXED_PAYOUT_TTL_SECONDS)
    if refused is None:
        evaluation = evaluate(facts, intake, settings.campaigns, source, value_sets=settings.value_sets,
                              today=now_dt.date(), now=now, prompt_evaluator=registry.prompt_evaluator())
        campaign = evaluation.campaign
        if evaluation.status == "disqualified":
            refused = "disqualified"
    if refused is None and sells_at_auction(campaign):
        record, refused = await _round(runtime, registry, http, endpoints, settings, tenant_id, campaign, facts,
                                       ping_id)
        auction = campaign.delivery.distribution.auction or Auction()  # type: ignore[union-attr]
        currency = auction.currency
        if refused is None and record is not None:
            won = sum(b.bid or 0.0 for b in record.bids if b.delivery_endpoint_id in record.winners)
            offered = payout(won, auction.margin)
            expires = datetime.fromisoformat(record.ended_at) + timedelta(seconds=record.bid_ttl_seconds)
    elif refused is None:
        offered = float(source.payout) if source is not None and source.payout is not None else None
    answer = PingAnswer(ping_id=ping_id, accepted=refused is None, bid=offered if refused is None else None,
                        currency=currency, expires_at=iso(expires), reason=refused)
    stored = PingRecord(ping_id=ping_id, source_id=source.source_id if source is not None else None,
                        campaign_id=intake.campaign_id, accepted=answer.accepted, bid=answer.bid, currency=currency,
                        reason=refused, auction_id=record.auction_id if record is not None else None,
                        created_at=now, expires_at=answer.expires_at, lead_id=None)

    def unit(tx: Session) -> None:
        _over_limit(tx, tenant_id, limits, now_dt)  # read again where concurrent pings are serialized
        for check, _ in limits:
            tx.caps.add_to_counter(tenant_id, check.scope, check.period_start)
        if record is not None:
            tx.auctions.record(tenant_id, record)
        tx.pings.insert(tenant_id, stored)

    await runtime.store.write(unit, may_refuse=True)
    return answer


def _refused_at_intake(tx: Session, runtime: Runtime, tenant_id: str, intake: Campaign,
                       source: IngestionSource | None, body: PingLead, lead, now_dt: datetime) -> str | None:
    """What the submit would refuse the lead for before routing: the source's attestation, its
    caps, or a duplicate (by digest: the ping's, or that of the contact it carries)."""
    if attestation_problem(intake, lead.compliance) is not None:
        return "disqualified"
    for check in source_cap_checks(intake, source, now_dt):
        if tx.caps.counter_value(tenant_id, check.scope, check.period_start) >= check.cap:
            return "cap"
    policy = effective_policy(runtime.config.defaults.dedupe_window_days, intake.qualification.dedupe_override)
    if lead.is_test or not policy.enabled:
        return None
    email = body.email_hash or (sha256_hex(lead.email) if lead.email else None)
    phone = body.phone_hash or (sha256_hex(lead.phone_e164) if lead.phone_e164 else None)
    if email is None and phone is None:
        return None
    earlier = tx.leads.earlier_leads_by_hash(tenant_id, intake.campaign_id, email, phone,
                                             iso(window_start(policy, now_dt)))
    digests = [(lead_id, sha256_hex(e) if e else None, sha256_hex(p) if p else None, at)
               for lead_id, e, p, at in earlier]
    return "duplicate" if find_duplicate(policy, email, phone, digests) is not None else None


async def _round(runtime: Runtime, registry: Registry, http: httpx.AsyncClient, endpoints: OpenedEndpoints,
                 settings: TenantSettings, tenant_id: str, campaign: Campaign, facts: dict,
                 ping_id: str) -> tuple[AuctionRecord | None, str | None]:
    """The ping's round with the partial lead, its winners reserved; or why there is no bid."""
    distribution = campaign.delivery.distribution
    assert distribution is not None
    auction = distribution.auction or Auction()
    now_dt = runtime.clock.now()
    reader = runtime.store.reader()
    with reader:
        field = auction_field(reader, settings, tenant_id, campaign, distribution, facts, now_dt)
    if not field.asked:
        return None, "no bid"
    bidders = []
    for entry in field.asked:
        opened = endpoints.get(tenant_id, settings.rev, entry.delivery_endpoint_id)
        bidders.append(Bidder(entry, opened, registry.delivery_adapter(opened.endpoint.adapter)
                              if opened is not None else None))
    record = await hold_round(auction_id=new_id("auc"), auction=auction, bidders=bidders, skipped=field.skipped,
                              facts=facts, registry=registry, http=http, clock=runtime.clock,
                              allow_private_addresses=runtime.config.delivery.allow_private_addresses)
    count = auction.max_winners if auction.mode == "shared" else 1
    with reader:
        winners = take_room(reader, settings, tenant_id, runtime.clock.now(), campaign, distribution,
                            ranked(record.bids), count)
    record = msgspec.structs.replace(record, winners=[w for w, _ in winners], ping_id=ping_id,
                                     campaign_id=campaign.campaign_id)
    return record, None if winners else "no bid"


def ping_page(runtime: Runtime, tenant_id: str, *, source_id: str | None, campaign_id: str | None,
              after_id: str | None, before_id: str | None, limit: int) -> dict:
    rows = runtime.store.reader().pings.page(tenant_id, source_id=source_id, campaign_id=campaign_id,
                                              after_id=after_id, before_id=before_id, limit=limit + 1)
    items = [{"pingId": r.ping_id, "sourceId": r.source_id, "campaignId": r.campaign_id, "accepted": r.accepted,
              "bid": r.bid, "currency": r.currency, "reason": r.reason, "createdAt": r.created_at,
              "leadId": r.lead_id} for r in rows[:limit]]
    more = len(rows) > limit
    return {"items": items, "nextCursor": items[-1]["pingId"] if more else None, "hasMore": more}
