"""Where a tenant's sealed credentials are kept: the ref naming each in the secret store.

A ref is `<kind>:<owner ids>:<field>`. Only ids that cannot hold ':' (campaign codes) sit between
two others, so a ref reads back unambiguously. Refs name their owner, never the value."""

from __future__ import annotations

from typing import Literal


def source_key_ref(campaign_id: str, source_id: str) -> str:
    return f"source:{campaign_id}:{source_id}:apiKey"


def endpoint_secret_ref(endpoint_id: str, field: str) -> str:
    """`field`: one of domain.endpoint's credential fields (auth.token, headers.<name>, url.userinfo...)."""
    return f"endpoint:{endpoint_id}:{field}"


def sms_secret_ref(provider_id: str, field: Literal["authToken", "apiKey"]) -> str:
    return f"sms:{provider_id}:{field}"


def webhook_secret_ref(webhook_id: str) -> str:
    return f"webhook:{webhook_id}:secret"


def pixel_token_ref(pixel_id: str) -> str:
    return f"pixel:{pixel_id}:accessToken"
