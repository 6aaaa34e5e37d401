"""Pure SMS rules: which number sends, which provider carries it,
what counts as a valid recipient or sender, and how many segments a text costs.

Sender, when `from` is omitted, in this order:
1. the campaign's assigned number: the first SMS-capable tenant number whose `campaignIds`
   names the campaign;
2. the campaign's SMS agent's number: `campaignAiAgents.rep.agentId` looked up in the tenant's
   `agents` (skipped when that number is listed among the numbers as not SMS-capable);
3. the first SMS-capable number of the tenant.

Provider, in this order: the campaign's override (`campaignProviders[<campaign code>]`), the
tenant's `defaultProviderId`, then the install's built-in default (`[sms] default_provider`, with
the install-wide credentials of `[sms.<type>]`).

Segments follow GSM 03.38 / 3GPP 23.040: a text made only of GSM-7 characters (the basic table,
plus the extension table whose characters cost two septets) is GSM-7, 160 septets in one
segment, 153 per segment when concatenated; anything else is UCS-2, 70 UTF-16 units in one
segment, 67 per segment when concatenated. An escape pair or a surrogate pair is never split
across segments (as carriers split them), so a long text can need one more segment than a plain
division says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from appliance.domain.messaging import SmsConfig, SmsProvider
from appliance.domain.normalize import to_e164

GSM7_BASIC = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
GSM7_EXTENSION = frozenset("\f^{}\\[~]|€")

GSM7_SINGLE, GSM7_MULTI = 160, 153
UCS2_SINGLE, UCS2_MULTI = 70, 67

Encoding = Literal["GSM-7", "UCS-2"]


@dataclass(frozen=True)
class Segments:
    encoding: Encoding
    count: int   # segments the text is sent in
    units: int   # septets (GSM-7) or UTF-16 code units (UCS-2)


def _pack(costs: list[int], single: int, multi: int) -> int:
    total = sum(costs)
    if total == 0:
        return 0
    if total <= single:
        return 1
    segments, used = 1, 0
    for cost in costs:
        if used + cost > multi:
            segments += 1
            used = 0
        used += cost
    return segments


def is_gsm7(text: str) -> bool:
    return all(ch in GSM7_BASIC or ch in GSM7_EXTENSION for ch in text)


def count_segments(text: str) -> Segments:
    if is_gsm7(text):
        costs = [2 if ch in GSM7_EXTENSION else 1 for ch in text]
        return Segments("GSM-7", _pack(costs, GSM7_SINGLE, GSM7_MULTI), sum(costs))
    costs = [2 if ord(ch) > 0xFFFF else 1 for ch in text]
    return Segments("UCS-2", _pack(costs, UCS2_SINGLE, UCS2_MULTI), sum(costs))


# ---- recipients and senders -----------------------------------------------------------------

_E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
_SHORT_CODE = re.compile(r"^[0-9]{3,8}$")
_ALPHANUMERIC_ID = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9 ]{1,11}$")


def is_e164(text: str) -> bool:
    """Written exactly in E.164 (`+` and digits, no formatting) and a possible number for its
    country (phonenumbers), like the phones the service stores."""
    return bool(_E164.match(text)) and to_e164(text, None) == text


def sender_problem(text: str) -> str | None:
    """What is wrong with a `from` override: an E.164 number, a short code (3 to 8 digits) or an
    alphanumeric sender id (up to 11 letters, digits or spaces, at least one letter)."""
    if is_e164(text) or _SHORT_CODE.match(text) or _ALPHANUMERIC_ID.match(text):
        return None
    return "must be an E.164 phone number, a short code or an alphanumeric sender id (up to 11 characters)"


# ---- resolution ------------------------------------------------------------------------------

SenderRule = Literal["from", "campaign_number", "agent_number", "first_sms_capable"]


@dataclass(frozen=True)
class SenderChoice:
    number: str | None          # None: nothing to send from
    rule: SenderRule | None


def resolve_sender(sms: SmsConfig | None, campaign_id: str | None, agent_id: str | None,
                   override: str | None = None) -> SenderChoice:
    if override:
        return SenderChoice(override, "from")
    if sms is None:
        return SenderChoice(None, None)
    capable = [n for n in sms.numbers if n.sms_capable]
    if campaign_id is not None:
        for number in capable:
            if campaign_id in number.campaign_ids:
                return SenderChoice(number.number, "campaign_number")
    if agent_id is not None:
        not_capable = {n.number for n in sms.numbers if not n.sms_capable}
        for agent in sms.agents:
            if agent.agent_id == agent_id and agent.number not in not_capable:
                return SenderChoice(agent.number, "agent_number")
    if capable:
        return SenderChoice(capable[0].number, "first_sms_capable")
    return SenderChoice(None, None)


ProviderRule = Literal["campaign", "tenant_default", "builtin"]


@dataclass(frozen=True)
class ProviderChoice:
    rule: ProviderRule
    type: str                        # the provider adapter's name: twilio, telnyx or a plugin's
    provider_id: str | None = None   # the tenant's providerId; None for the built-in default
    provider: SmsProvider | None = None


def resolve_provider(sms: SmsConfig | None, campaign_id: str | None, builtin_type: str) -> ProviderChoice:
    if sms is not None:
        by_id = {p.provider_id: p for p in sms.providers}
        if campaign_id is not None:
            chosen = by_id.get(sms.campaign_providers.get(campaign_id, ""))
            if chosen is not None:
                return ProviderChoice("campaign", chosen.type, chosen.provider_id, chosen)
        if sms.default_provider_id is not None and sms.default_provider_id in by_id:
            chosen = by_id[sms.default_provider_id]
            return ProviderChoice("tenant_default", chosen.type, chosen.provider_id, chosen)
    return ProviderChoice("builtin", builtin_type)


# ---- two-way: keywords and delivery reports --------------------------------------------------

Keyword = Literal["stop", "start", "help"]

# The whole message, trimmed, in any case (the carriers' and CTIA's keywords).
_KEYWORDS: dict[str, Keyword] = {
    **dict.fromkeys(("STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "REVOKE", "OPTOUT"), "stop"),
    **dict.fromkeys(("START", "UNSTOP"), "start"),
    **dict.fromkeys(("HELP", "INFO"), "help"),
}


def keyword_of(text: str) -> Keyword | None:
    return _KEYWORDS.get(text.strip().upper())


# How far along an outbound message is: a report never moves it back (reports may come out of
# order). `error` and `failed` from the send itself carry no provider id, so no report finds them.
_PROGRESS = {"sending": 0, "queued": 1, "sent": 2, "delivered": 3, "undelivered": 3, "failed": 3, "error": 3}


def report_moves(current: str, reported: str) -> bool:
    return _PROGRESS.get(reported, -1) > _PROGRESS.get(current, 0)
