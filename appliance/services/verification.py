"""Running a campaign's verification steps on one lead; what their outcomes do is
domain/verification.py's.

- A verifier whose `verify` is a coroutine function is awaited on the event loop. A plain
  function runs in a worker thread of the `verifier` pool, unless the verifier says it is not
  `blocking` (it computes for microseconds, like the built-in `phone`): then it runs inline.
- The steps of a lead run concurrently, each under its own `timeoutMs`: past it the step is
  `unknown` (a thread still running then is left to finish; its answer is dropped).
- Anything but a well-formed `VerificationResult` (an exception, another type, an outcome other
  than pass / fail / unknown, a reason that is not text, data that is not a JSON object of at
  most 16 KiB nesting at most 32 levels) is `unknown`, with the reason; the verifier's configured values (its plugin
  table) are masked in reasons, data and log lines. A built-in verifier's result is the
  appliance's own and taken as it is (the checks cost a phone step a tenth of its time).
- With `cacheSeconds`, a pass or fail is reused for that long, in this process, for the same
  tenant, verifier, config and value (the verifier's `cache_key`); `unknown` is never kept.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, NamedTuple

import httpx
import msgspec

from appliance import sdk
from appliance.adapters.outbound import Scrubber, http_client
from appliance.clock import Clock, iso
from appliance.domain.campaign import Campaign, Verification
from appliance.domain.lead import LeadRecord
from appliance.domain.rules import MISSING, IdentityCache
from appliance.domain.verification import (
    MAX_DATA_BYTES,
    MAX_DATA_DEPTH,
    OUTCOMES,
    StepResult,
    Verdict,
    judge,
    nested_deeper,
    sampled,
)
from appliance.plugins import Registry
from appliance.runtime import Runtime

log = logging.getLogger("appliance.verification")

MAX_REASON_CHARS = 300
POOL_THREADS = 32  # blocking verifiers running at once in a process; more wait their turn (and their timeout)
CACHE_ENTRIES = 100_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


class _Prepared(NamedTuple):
    """A loaded verifier and what running it needs."""

    adapter: sdk.Verifier
    settings: dict[str, Any]
    inline: bool  # a plain `verify` that does not block: called on the loop
    scrub: Scrubber | None  # masks the plugin table's values; None when it has none
    builtin: bool  # one of appliance/adapters: its answers are not checked


class _Step(NamedTuple):
    step: Verification
    prepared: _Prepared | None  # None: no verifier of that name is loaded
    timeout_seconds: float


class _Plan(NamedTuple):
    """A campaign's steps with their verifiers, worked out once per configuration and registry."""

    steps: tuple[_Step, ...]
    costly: bool  # a step calls out or blocks (I/O, a thread): worth a duplicate check first


_plans = IdentityCache()
# The client of verifiers that call out, for the event loop it was made on (a process serves on
# one loop; another loop, a CLI import's, gets a client of its own).
_loop_client: tuple[asyncio.AbstractEventLoop | None, httpx.AsyncClient | None] = (None, None)
_pool: ThreadPoolExecutor | None = None


class _Cache:
    """Results by (tenant, verifier, config, value), each until its deadline (monotonic seconds)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._entries: dict[tuple[str, str, bytes, str], tuple[float, StepResult]] = {}

    def get(self, key: tuple[str, str, bytes, str], now: float) -> StepResult | None:
        found = self._entries.get(key)
        return found[1] if found is not None and found[0] > now else None

    def put(self, key: tuple[str, str, bytes, str], result: StepResult, seconds: int, now: float) -> None:
        if len(self._entries) >= self._limit:
            self._entries = {k: v for k, v in self._entries.items() if v[0] > now}
            while len(self._entries) >= self._limit:  # all still fresh: the oldest go first
                del self._entries[next(iter(self._entries))]
        self._entries.pop(key, None)
        self._entries[key] = (now + seconds, result)


_cache = _Cache(CACHE_ENTRIES)


def costly(registry: Registry, steps: Sequence[Verification]) -> bool:
    """Whether any step does more than compute on the loop (I/O, a thread): worth a duplicate
    check before the steps run."""
    return _plan(registry, steps).costly


def _plan(registry: Registry, steps: Sequence[Verification]) -> _Plan:
    plan = _plans.get(steps, registry)
    if plan is MISSING:
        prepared = {step.verifier: _prepare(registry, step.verifier) for step in steps}
        plan = _plans.put(steps, registry, _Plan(
            tuple(_Step(step, prepared[step.verifier], step.timeout_ms / 1000) for step in steps),
            any(p is not None and not p.inline for p in prepared.values())))
    return plan


async def verify_lead(runtime: Runtime, registry: Registry, campaign: Campaign, lead: LeadRecord, facts: dict[str, Any],
                      tenant_id: str, now: datetime, http: httpx.AsyncClient | None = None
                      ) -> tuple[LeadRecord, Verdict]:
    """Run the campaign's steps on a lead: the lead with their results (which `facts`, read by the
    rules next, get too) and their verdict."""
    steps = campaign.qualification.verifications
    results = await run_steps(registry, steps, facts, tenant_id=tenant_id, clock=runtime.clock, now=now,
                              allow_private=runtime.config.delivery.allow_private_addresses, http=http)
    verdict = judge(steps, results, iso(now))
    if verdict.results:
        facts["verification"] = {**lead.verification, **verdict.results}
        lead = msgspec.structs.replace(lead, verification=facts["verification"])
    return lead, verdict


async def run_steps(registry: Registry, steps: Sequence[Verification], lead: dict[str, Any], *, tenant_id: str,
                    clock: Clock, now: datetime, allow_private: bool, http: httpx.AsyncClient | None = None,
                    draw: Callable[[], float] = random.random) -> list[StepResult]:
    """The results of the steps that check this lead (see `sampled`), in the campaign's order.
    `lead`: the lead as rules see it; `http`: the client for verifiers that call out (None: this
    event loop's own)."""
    client = http if http is not None else _client()
    results: list[StepResult | None] = []
    waiting: list[tuple[int, Verification, _Prepared, sdk.VerificationRequest, Any]] = []
    cached: dict[int, tuple[tuple[str, str, bytes, str], int]] = {}  # result index -> (key, seconds)
    for step, prepared, timeout_seconds in _plan(registry, steps).steps:
        if not sampled(step, draw()):
            continue
        if prepared is None:
            results.append(_unknown(step.verifier, f"no verifier named {step.verifier!r} is loaded"))
            continue
        request = sdk.VerificationRequest(lead=lead, config=step.config, settings=prepared.settings,
                                          timeout_seconds=timeout_seconds, allow_private_addresses=allow_private,
                                          now=now)
        if step.cache_seconds and (key := _cache_key(prepared, step, request, tenant_id)) is not None:
            hit = _cache.get(key, clock.monotonic())
            if hit is not None:
                results.append(msgspec.structs.replace(hit, cached=True))
                continue
            cached[len(results)] = (key, step.cache_seconds)
        answer = _inline(prepared, step.verifier, request, client) if prepared.inline else None
        if prepared.inline and (type(answer) is sdk.VerificationResult or not inspect.isawaitable(answer)):
            results.append(_checked(prepared, step.verifier, answer))
        else:
            waiting.append((len(results), step, prepared, request, answer))
            results.append(None)
    if waiting:
        answers = await asyncio.gather(*(_within(prepared, step.verifier, request, client, pending)
                                         for _, step, prepared, request, pending in waiting))
        for (i, step, prepared, _, _), answer in zip(waiting, answers):
            results[i] = _checked(prepared, step.verifier, answer)
    done = [result for result in results if result is not None]  # every one is set by now
    for i, (key, seconds) in cached.items():
        if done[i].outcome != "unknown":
            _cache.put(key, done[i], seconds, clock.monotonic())
    return done


def _prepare(registry: Registry, name: str) -> _Prepared | None:
    adapter = registry.verifier(name)
    if adapter is None:
        return None
    settings = registry.adapter_settings("verifier", name)
    values = _strings(settings)
    inline = not inspect.iscoroutinefunction(adapter.verify) and not adapter.blocking
    return _Prepared(adapter, settings, inline, Scrubber(values) if values else None,
                     type(adapter).__module__.startswith("appliance.adapters."))


def _strings(value: Any) -> list[str]:
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def _client() -> httpx.AsyncClient:
    global _loop_client
    loop, client = _loop_client
    if loop is not asyncio.get_running_loop() or client is None:
        loop, client = _loop_client = asyncio.get_running_loop(), http_client()
    return client


def _threads() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="verifier")
    return _pool


def _cache_key(prepared: _Prepared, step: Verification, request: sdk.VerificationRequest,
               tenant_id: str) -> tuple[str, str, bytes, str] | None:
    try:
        value = prepared.adapter.cache_key(request)
    except Exception as exc:  # a plugin's bug: the step runs, uncached
        log.warning("verifier %r: cache_key raised %s", step.verifier, _described(prepared, exc))
        return None
    if not isinstance(value, str):
        return None
    return tenant_id, step.verifier, msgspec.json.encode(step.config, order="sorted"), value


def _unknown(name: str, reason: str) -> StepResult:
    return StepResult(name, "unknown", reason=reason)


def _described(prepared: _Prepared, exc: BaseException) -> str:
    """`Type: message` on one line, the plugin's values masked."""
    text = " ".join(str(exc).split())
    return _clean(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, prepared)


def _raised(prepared: _Prepared, name: str, exc: BaseException) -> StepResult:
    problem = _described(prepared, exc)
    log.warning("verifier %r raised %s", name, problem)
    return _unknown(name, f"{name} raised {problem}"[:MAX_REASON_CHARS])


def _inline(prepared: _Prepared, name: str, request: sdk.VerificationRequest, http: httpx.AsyncClient) -> Any:
    """A non-blocking verifier's answer, computed here; past its timeout it is `unknown`."""
    started = time.perf_counter()
    try:
        answer = prepared.adapter.verify(request, http)
    except Exception as exc:
        return _raised(prepared, name, exc)
    if time.perf_counter() - started > request.timeout_seconds and not inspect.isawaitable(answer):
        return _unknown(name, f"{name} did not answer within {request.timeout_seconds:g} s")
    return answer


async def _within(prepared: _Prepared, name: str, request: sdk.VerificationRequest, http: httpx.AsyncClient,
                  pending: Any) -> Any:
    """The answer of a verifier that waits (a coroutine, a thread, or `pending`, an awaitable an
    inline one gave back), under the step's timeout."""
    try:
        async with asyncio.timeout(request.timeout_seconds):
            if pending is not None:
                return await pending
            if inspect.iscoroutinefunction(prepared.adapter.verify):
                return await prepared.adapter.verify(request, http)  # type: ignore[misc]
            answer = await asyncio.get_running_loop().run_in_executor(_threads(), prepared.adapter.verify, request,
                                                                      http)
            return await answer if inspect.isawaitable(answer) else answer
    except TimeoutError:
        return _unknown(name, f"{name} did not answer within {request.timeout_seconds:g} s")
    except Exception as exc:
        return _raised(prepared, name, exc)


def _checked(prepared: _Prepared, name: str, answer: Any) -> StepResult:
    """A verifier's answer as kept: checked, its data as plain JSON values, its words masked."""
    if isinstance(answer, StepResult):
        return answer
    if prepared.builtin and type(answer) is sdk.VerificationResult:
        return StepResult(name, answer.outcome, answer.reason, answer.data)
    if not isinstance(answer, sdk.VerificationResult):
        return _unknown(name, f"{name} answered {type(answer).__name__}, not a VerificationResult")
    outcome, reason, data = answer.outcome, answer.reason, answer.data
    if not isinstance(outcome, str) or outcome not in OUTCOMES:
        return _unknown(name, f"{name} answered an outcome other than pass, fail or unknown")
    if reason is not None and not isinstance(reason, str):
        return _unknown(name, f"{name} answered a reason that is not text")
    if not isinstance(data, dict):
        return _unknown(name, f"{name} answered data that is not an object")
    deeper = f"{name} answered data nested deeper than {MAX_DATA_DEPTH} levels"
    try:
        data = msgspec.to_builtins(data, str_keys=True)
    except RecursionError:  # nested past the interpreter's limit, or an object that holds itself
        return _unknown(name, deeper)
    except (TypeError, ValueError, OverflowError) as exc:
        return _unknown(name, f"{name} answered data that is not JSON ({type(exc).__name__})")
    if nested_deeper(data):
        return _unknown(name, deeper)
    try:
        size = len(msgspec.json.encode(data))
    except (TypeError, ValueError, OverflowError) as exc:
        return _unknown(name, f"{name} answered data that is not JSON ({type(exc).__name__})")
    if size > MAX_DATA_BYTES:
        return _unknown(name, f"{name} answered {size} bytes of data, more than {MAX_DATA_BYTES}")
    if prepared.scrub is not None:
        data = prepared.scrub.value(data)
    return StepResult(name, outcome, _clean(reason, prepared) if reason is not None else None, data)


def _clean(text: str, prepared: _Prepared) -> str:
    """A reason as kept and logged: the plugin's values masked, no control characters, capped."""
    if prepared.scrub is not None:
        text = prepared.scrub(text) or ""
    return (text if text.isprintable() else _CONTROL.sub(" ", text))[:MAX_REASON_CHARS]
