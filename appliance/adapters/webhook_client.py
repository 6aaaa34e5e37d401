"""Sending one signed event to a subscriber: the delivery client's HTTP/1.1 keep-alive connections
and its SSRF guard (netguard: the address is checked, then connected to directly, so a second
DNS answer cannot redirect the send), under one deadline. Redirects are not followed."""

from __future__ import annotations

import asyncio
from typing import NamedTuple

from appliance.adapters import http1, netguard
from appliance.adapters.http_delivery import parse_target

MAX_ANSWER_BYTES = 64 * 1024  # only the status matters; the body is read to keep the connection


class SendResult(NamedTuple):
    status_code: int | None
    error: str | None  # None: the receiver took it (2xx)


class WebhookClient:
    def __init__(self) -> None:
        self._client = http1.Client()

    async def post(self, url: str, headers: list[tuple[str, str]], body: bytes, *, timeout: float,
                   allow_private: bool) -> SendResult:
        target = parse_target(url)
        if target is None:
            return SendResult(None, "url: not an http or https URL with a host")
        try:
            async with asyncio.timeout(timeout):
                destination = await netguard.resolve_destination(
                    url, allow_private, timeout=min(timeout, netguard.RESOLVE_TIMEOUT_SECONDS))
                if destination.reason:
                    return SendResult(None, destination.reason)
                address = destination.ip or target.host
                server_name = None
                if target.scheme == "https":
                    server_name = address if target.host_is_address else target.host
                request = http1.build_request(
                    "POST", target.raw_path,
                    [("Host", target.authority), ("User-Agent", "appliance-webhooks"),
                     ("Content-Type", "application/json"), ("Accept-Encoding", "identity"), *headers], body)
                response = await self._client.send(http1.Origin(target.scheme, address, target.port, server_name),
                                                   request, max_body=MAX_ANSWER_BYTES)
        except TimeoutError:
            return SendResult(None, f"timed out after {timeout:g} s")
        except http1.ConnectFailed as exc:
            return SendResult(None, f"connection failed: {str(exc)[:200]}")
        except http1.HttpError as exc:
            return SendResult(None, f"connection error: {str(exc)[:200] or type(exc).__name__}")
        if 200 <= response.status < 300:
            return SendResult(response.status, None)
        if 300 <= response.status < 400:
            return SendResult(response.status, f"answered {response.status}: redirect not followed")
        return SendResult(response.status, f"answered {response.status}")

    async def aclose(self) -> None:
        await self._client.aclose()
