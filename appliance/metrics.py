"""What `GET /metrics` shows, in the Prometheus text format (prometheus-client renders it).

The paths that count things (submit, the delivery worker) bump plain dicts: a prometheus-client
metric takes a lock per update, more than a submit can spare. A collector turns the counts into
metric families at scrape time, and reads the queue depth from the database then. A request's
latency goes into its route's bucket counts as it ends (one bisect: well under a microsecond).
prometheus-client is imported when the app is built, not by every command that opens a runtime."""

from __future__ import annotations

from dataclasses import dataclass

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator

from typing import Any

# Seconds; a submit takes a few milliseconds, a slow list or import up to seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.submits: Counter[str] = Counter()  # by the lead status a submit answered
        self.deliveries: Counter[tuple[str, str]] = Counter()  # by (outcome, delivery endpoint)
        self._latency: dict[tuple[str, str], list[int]] = {}  # (method, route) -> count per bucket, +Inf last
        self._latency_sum: Counter[tuple[str, str]] = Counter()

    def observe_request(self, method: str, route: str, seconds: float) -> None:
        key = (method, route)
        counts = self._latency.get(key)
        if counts is None:
            counts = self._latency[key] = [0] * (len(LATENCY_BUCKETS) + 1)
        counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self._latency_sum[key] += seconds

    def families(self, read: Callable[[], StoredReadings]) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        submits = CounterMetricFamily("appliance_submits", "Leads submitted, by the status the submit answered",
                                      labels=["status"])
        for status, count in sorted(self.submits.items()):
            submits.add_metric([status], count)
        yield submits
        deliveries = CounterMetricFamily("appliance_deliveries", "Delivery attempts, by outcome and endpoint",
                                         labels=["outcome", "endpoint"])
        for (outcome, endpoint), count in sorted(self.deliveries.items()):
            deliveries.add_metric([outcome, endpoint], count)
        yield deliveries
        stored = read()
        depth = GaugeMetricFamily("appliance_queue_depth", "Jobs waiting or running, by kind and state",
                                  labels=["kind", "state"])
        for kind, state, count in stored.queue:
            depth.add_metric([kind, state], count)
        yield depth
        waiting = GaugeMetricFamily("appliance_webhook_backlog",
                                    "Webhook events not yet delivered, by whether they wait for a retry",
                                    labels=["state"])
        fresh, retrying = stored.backlog
        waiting.add_metric(["queued"], fresh)
        waiting.add_metric(["retrying"], retrying)
        yield waiting
        yield GaugeMetricFamily("appliance_endpoints_paused",
                                "Delivery endpoints paused (by their health policy or by hand), all tenants",
                                value=stored.paused_endpoints)
        latency = HistogramMetricFamily("appliance_request_duration_seconds",
                                        "Time to answer a request, by method and route", labels=["method", "route"])
        for (method, route), counts in sorted(self._latency.items()):
            running, buckets = 0, []
            for bound, count in zip([*map(str, LATENCY_BUCKETS), "+Inf"], counts):
                running += count
                buckets.append((bound, running))
            latency.add_metric([method, route], buckets, self._latency_sum[(method, route)])
        yield latency


@dataclass(frozen=True)
class StoredReadings:
    """What a scrape reads from the database."""
    queue: list[tuple[str, str, int]]  # (kind, state, jobs)
    backlog: tuple[int, int]  # webhook events (queued for a first try, waiting for a retry)
    paused_endpoints: int


class _Collector:
    def __init__(self, metrics: Metrics, read: Callable[[], StoredReadings]) -> None:
        self.metrics = metrics
        self.read = read

    def collect(self) -> Iterator[Any]:
        return self.metrics.families(self.read)


def exposition(metrics: Metrics, read: Callable[[], StoredReadings]) -> Callable[[], bytes]:
    """A function that renders the current metrics (one registry for the app, not the global one)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(metrics, read))  # type: ignore[arg-type]
    return lambda: generate_latest(registry)
