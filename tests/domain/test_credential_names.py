"""Which header and query parameter names are taken for credentials (their values are sealed in
the secret store and masked in exports): whole words of the name, not letters inside a word."""

from __future__ import annotations

import pytest

from appliance.domain.endpoint import looks_like_credential


@pytest.mark.parametrize("name", [
    "Authorization", "X-Api-Key", "api_key", "apiKey", "APIKEY", "access_token", "accessToken", "X-Buyer-Token",
    "client_secret", "password", "passwd", "pwd", "X-Signature", "sig", "Cookie", "session_id", "sessionid",
    "X-Auth", "Proxy-Authorization", "refresh_token", "mytoken", "buyerApiKey", "credentials", "Bearer",
])
def test_credential_names(name):
    assert looks_like_credential(name)


@pytest.mark.parametrize("name", [
    "keyword", "author", "design", "passenger", "Content-Type", "X-Partner-Id", "vendor", "state", "zip",
    "X-Request-Id", "Accept", "campaign", "source_id", "page", "monkey", "Keystone",
])
def test_ordinary_names(name):
    assert not looks_like_credential(name)
