"""Tenant bundles for tests, built as plain dicts (the import file's shape)."""

from __future__ import annotations

import copy


def campaign(code: str, name: str, *, client: tuple[str, str] = ("cli-1", "Client One"),
             offer: tuple[str, str] = ("off-1", "Offer One"), **extra) -> dict:
    return {
        "campaignId": code,
        "name": name,
        "client": {"clientId": client[0], "clientName": client[1]},
        "offer": {"offerId": offer[0], "offerName": offer[1]},
        **extra,
    }


def standard_bundle(prefix: str = "A") -> dict:
    """Three campaigns (one inactive, one archived), a questionnaire, a custom field, a value set,
    an endpoint with a secret, SMS settings with a token, a pixel with a token."""
    return copy.deepcopy({
        "valueSets": [{"valueSetId": "states", "values": ["CA", "TX"]}],
        "questionnaires": [{"questionnaireId": f"{prefix}-q1", "name": "Intake",
                            "questions": [{"key": "injured", "question": "Were you injured?"}]}],
        "fieldLibrary": [{"key": "injured", "label": "Injured", "question": "Were you injured?",
                          "category": "question"}],
        "deliveryEndpoints": [{"deliveryEndpointId": f"{prefix}-ep", "url": "https://buyer.example.com/in",
                               "auth": {"type": "bearer", "token": "endpoint-secret-token-123"}}],
        "sms": {"providers": [{"providerId": "tw", "type": "twilio", "accountSid": "AC123",
                               "authToken": "sms-secret-token-456"}],
                "numbers": [{"number": "+14155552671", "campaignIds": [f"{prefix}C01"]}],
                "defaultProviderId": "tw"},
        "pixels": [{"pixelId": f"{prefix}-px", "platform": "social", "accessToken": "pixel-secret-token-789"}],
        "campaigns": [
            campaign(f"{prefix}C01", "Auto Accident West", client=("cli-1", "Smith Law"), offer=("off-1", "Auto"),
                     questionnaireId=f"{prefix}-q1",
                     ingestion={"sources": [{"sourceId": f"{prefix}-src", "name": "Web form",
                                             "apiKey": f"imported-source-key-{prefix}-0123456789"}]},
                     delivery={"deliveryEndpointId": f"{prefix}-ep"}),
            campaign(f"{prefix}C02", "Solar Homes", client=("cli-2", "Sunny Co"), offer=("off-2", "Solar"),
                     active=False),
            campaign(f"{prefix}C03", "Old Mass Tort", client=("cli-1", "Smith Law"), offer=("off-3", "Tort"),
                     archivedAt="2026-01-01T00:00:00.000Z"),
        ],
    })
