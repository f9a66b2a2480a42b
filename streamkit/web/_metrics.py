"""``/metrics``: the host's status in the Prometheus text format, rebuilt on every scrape.

Each scrape asks the host for its status (the same as ``streamkit status``)
and the log for its counters, and writes them through prometheus-client's
exposition: no metric state is kept between scrapes, so nothing here can
drift from what ``status`` says. Every metric is documented in
docs/metrics.md; the names and labels below are the contract.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from streamkit._version import __version__
from streamkit.web._plugins import Gauge

__all__ = ["CONTENT_TYPE_LATEST", "LATENCY_BUCKETS", "exposition"]

LATENCY_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""The ``le`` edges (seconds) of the append-to-process latency histogram."""

_LABELS = ["slug", "path"]


class _Scrape:
    """A collector over one scrape's facts (registered in a registry of its own)."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def exposition(
    status: dict[str, Any],
    *,
    follow_age: float | None,
    log_stats: Any,
    lag_seconds: dict[tuple[str, str], float],
    histograms: dict[tuple[str, str], tuple[list[int], int, float]],
    gauges: Sequence[Gauge] = (),
) -> bytes:
    """The Prometheus text of one scrape (``gauges``: what plugins report).

    ``lag_seconds`` is the age of the oldest unprocessed event per
    ``(slug, path)``; ``histograms`` the cumulative latency counts at
    :data:`LATENCY_BUCKETS`, the sample count and their sum.
    """
    families = _processor_families(status, lag_seconds, histograms)
    families.extend(_host_families(status, follow_age, log_stats))
    families.extend(_retention_families(status.get("retention") or []))
    families.extend(_policy_families(status.get("retention_job")))
    for gauge in gauges:
        family = GaugeMetricFamily(gauge.name, gauge.help, labels=list(gauge.labels))
        for labels, value in gauge.samples:
            family.add_metric(list(labels), value)
        families.append(family)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(families))
    return generate_latest(registry)


def _processor_families(
    status: dict[str, Any],
    lag_seconds: dict[tuple[str, str], float],
    histograms: dict[tuple[str, str], tuple[list[int], int, float]],
) -> list[Metric]:
    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"streamkit_processor_{name}", doc, labels=_LABELS)

    def counter(name: str, doc: str) -> CounterMetricFamily:
        return CounterMetricFamily(f"streamkit_processor_{name}", doc, labels=_LABELS)

    cursor = gauge("cursor", "The offset the processor has reduced and processed through.")
    head = gauge("head", "The last durable offset of the processor's path.")
    lag = gauge("lag_events", "Durable events after the cursor.")
    lag_s = gauge("lag_seconds", "Age of the oldest durable event not yet processed (0 if none).")
    since = gauge(
        "seconds_since_progress",
        "Seconds since the cursor last moved in this host (its uptime if never).",
    )
    stalled = gauge("stalled", "1 while the processor is stalled (its batches keep failing).")
    ahead = gauge(
        "ahead_of_code",
        "1 while the processor is stopped here at a stored payload newer than its code "
        "(SCHEMA_AHEAD); a host running newer code takes it over.",
    )
    running = gauge("running", "1 while this host holds the processor's lease and runs it.")
    retired = gauge(
        "retired",
        "1 while this host runs a version a cutover replaced: it leaves the processor to hosts "
        "running the serving version (until a rollback reinstates it).",
    )
    unserved = gauge(
        "unserved",
        "1 while no live host serves the processor: its serving lease has been held by no "
        "live host for two heartbeats (alert on it: nothing processes its path).",
    )
    cannot_build = gauge(
        "cannot_build",
        "1 while the version this host runs cannot be built: history it needs was deleted "
        "(its build stopped and is not retried; status says how to go on).",
    )
    reduced = counter("events_reduced", "Events reduced by this host.")
    batches = counter("batches", "Batches committed by this host.")
    failures = counter("batch_failures", "Batches that failed in this host (each retried whole).")
    malformed = counter(
        "malformed_payloads", "Events skipped because their payload failed its schema."
    )
    reduce_failures = counter("reduce_failures", "Events whose reduce raised (state kept).")
    malformed_by_type = CounterMetricFamily(
        "streamkit_processor_malformed_payloads_by_type",
        "Events skipped as malformed, per stored type and payload version.",
        labels=[*_LABELS, "type", "version"],
    )
    dropped = counter(
        "events_dropped", "Events an upcaster dropped: the current code no longer reads their type."
    )
    awaiting = gauge(
        "awaiting_cutover",
        "1 while a version built in the shadow here waits for an operator's cutover "
        "(streamkit processor cutover); it follows the serving version meanwhile.",
    )
    serving = gauge(
        "serving",
        "1 while the processor runs here and serves current state (past its catch-up and any "
        "shadow build of a new version); 0 while it catches up or builds.",
    )
    progress = gauge(
        "progress_offset",
        "While it catches up or rebuilds: the offset it has reached (see _target_offset).",
    )
    target = gauge(
        "progress_target_offset", "While it catches up or rebuilds: the offset it works towards."
    )
    schema_problems = gauge(
        "schema_check_problems",
        "Stored (type, version) keys the processor's code would skip or stall at, found by "
        "the host's data check at start (absent under schema_check = off).",
    )
    refusing = gauge(
        "work_refusing_cancel",
        "Cancelled work of the processor still running (it ignores cancels).",
    )
    refused = counter(
        "work_refused_cancel", "Cancelled work that was still running 2 s after its cancel."
    )
    latency = HistogramMetricFamily(
        "streamkit_processor_latency_seconds",
        "Seconds from an event's commit to its batch's checkpoint in this host.",
        labels=_LABELS,
    )
    uptime = float((status.get("host") or {}).get("uptime") or 0.0)
    for row in status.get("processors", []):
        key = (row["slug"], row["path"])
        labels = list(key)
        if row.get("cursor") is not None:
            cursor.add_metric(labels, float(row["cursor"]))
        if row.get("head") is not None:
            head.add_metric(labels, float(row["head"]))
        if row.get("lag") is not None:
            lag.add_metric(labels, float(row["lag"]))
        lag_s.add_metric(labels, lag_seconds.get(key, 0.0))
        age = row.get("last_batch_age")
        since.add_metric(labels, float(uptime if age is None else age))
        stalled.add_metric(labels, 1.0 if row.get("stalled") else 0.0)
        ahead.add_metric(labels, 1.0 if row.get("ahead_of_code") else 0.0)
        running.add_metric(labels, 1.0 if row.get("lease_held_here") else 0.0)
        retired.add_metric(labels, 1.0 if row.get("retired") else 0.0)
        unserved.add_metric(labels, 1.0 if row.get("unserved") else 0.0)
        cannot_build.add_metric(labels, 1.0 if row.get("cannot_build") else 0.0)
        reduced.add_metric(labels, float(row.get("events_reduced", 0)))
        batches.add_metric(labels, float(row.get("batches", 0)))
        failures.add_metric(labels, float(row.get("batch_failures", 0)))
        malformed.add_metric(labels, float(row.get("malformed_payloads", 0)))
        for kind in row.get("malformed_by_type") or ():
            malformed_by_type.add_metric(
                [*labels, kind["type"], str(kind["version"])], float(kind["count"])
            )
        reduce_failures.add_metric(labels, float(row.get("reduce_failures", 0)))
        dropped.add_metric(labels, float(row.get("dropped_events", 0)))
        phase = row.get("phase")
        if phase is not None:
            serving.add_metric(labels, 1.0 if phase == "serving" else 0.0)
            awaiting.add_metric(labels, 1.0 if phase == "awaiting-cutover" else 0.0)
        reached = row.get("progress")
        if reached is not None:
            progress.add_metric(labels, float(reached.get("through") or 0))
            target.add_metric(labels, float(reached.get("target") or 0))
        checked = row.get("schema_check")
        if checked is not None:
            schema_problems.add_metric(labels, float(len(checked["problems"])))
        refusing.add_metric(labels, float(len(row.get("refusing_cancel") or ())))
        refused.add_metric(labels, float(row.get("refused_cancel", 0)))
        counts, total, seconds = histograms.get(key, ([0] * len(LATENCY_BUCKETS), 0, 0.0))
        buckets = [(_le(edge), float(n)) for edge, n in zip(LATENCY_BUCKETS, counts, strict=True)]
        buckets.append(("+Inf", float(total)))
        latency.add_metric(labels, buckets, seconds)
    return [
        cursor,
        head,
        lag,
        lag_s,
        since,
        stalled,
        ahead,
        running,
        retired,
        unserved,
        cannot_build,
        reduced,
        batches,
        failures,
        malformed,
        malformed_by_type,
        reduce_failures,
        dropped,
        awaiting,
        serving,
        progress,
        target,
        schema_problems,
        refusing,
        refused,
        latency,
    ]


# The host's clients-first counters (docs/host.md, "Clients first"): name, key, help.
_CLIENTS_FIRST = (
    (
        "streamkit_host_clients_first_pauses",
        "pauses",
        "Processor ranges that waited for clients contending for the host (docs/host.md).",
    ),
    (
        "streamkit_host_clients_first_paused_seconds",
        "paused_seconds",
        "Seconds processor ranges waited for contending clients, in total.",
    ),
    (
        "streamkit_host_held_writes",
        "held_writes",
        "Processors' writes that waited for a contending client's commit to share it.",
    ),
)


# What the host's rebuilds gave way to its serving processors (docs/rebuilds.md).
_SERVING_FIRST = (
    (
        "streamkit_host_rebuild_waits",
        "waits",
        "Turns of shadow rebuilds that waited for a serving processor's range (docs/rebuilds.md).",
    ),
    (
        "streamkit_host_rebuild_waited_seconds",
        "waited_seconds",
        "Seconds shadow rebuilds waited for serving processors, in total.",
    ),
)


def _host_families(
    status: dict[str, Any], follow_age: float | None, log_stats: Any
) -> list[Metric]:
    database = status.get("database") or {}
    up = GaugeMetricFamily("streamkit_database_reachable", "1 while the log's database answers.")
    up.add_metric([], 1.0 if database.get("reachable", True) else 0.0)
    follow = GaugeMetricFamily(
        "streamkit_host_follow_age_seconds",
        "Seconds since the log last looked for other processes' commits (absent: nobody follows).",
    )
    if follow_age is not None:
        follow.add_metric([], follow_age)
    leases = GaugeMetricFamily("streamkit_host_leases_held", "Processor leases this host holds.")
    leases.add_metric(
        [], float(sum(1 for row in status.get("processors", []) if row.get("lease_held_here")))
    )
    uptime = GaugeMetricFamily("streamkit_host_uptime_seconds", "Seconds since the host started.")
    uptime.add_metric([], float((status.get("host") or {}).get("uptime") or 0.0))
    appended = CounterMetricFamily(
        "streamkit_host_appended_events", "Durable events this host's log connection committed."
    )
    appended.add_metric([], float(log_stats.appended))
    commits = CounterMetricFamily(
        "streamkit_host_commits", "Write transactions this host's log connection committed."
    )
    commits.add_metric([], float(log_stats.transactions))
    refused = CounterMetricFamily(
        "streamkit_host_refused_appends", "Append calls this host's log refused (nothing written)."
    )
    refused.add_metric([], float(log_stats.refused))
    frozen = CounterMetricFamily(
        "streamkit_host_frozen_sessions_ended",
        "Sessions of frozen processes this host's log writer ended: they held locks it waited "
        "for past its lock timeout (PostgreSQL).",
    )
    frozen.add_metric([], float(log_stats.frozen_sessions_ended))
    first = (status.get("host") or {}).get("clients_first") or {}
    clients_first = []
    for name, key, text in _CLIENTS_FIRST:
        counter = CounterMetricFamily(name, text)
        counter.add_metric([], float(first.get(key, 0)))
        clients_first.append(counter)
    given = (status.get("host") or {}).get("serving_first") or {}
    for name, key, text in _SERVING_FIRST:
        counter = CounterMetricFamily(name, text)
        counter.add_metric([], float(given.get(key, 0)))
        clients_first.append(counter)
    build = InfoMetricFamily(
        "streamkit_build",
        "The streamkit and Python versions this host runs.",
        value={"version": __version__, "python": platform.python_version()},
    )
    scraped = GaugeMetricFamily(
        "streamkit_scrape_timestamp_seconds", "When this scrape was taken (Unix time)."
    )
    scraped.add_metric([], time.time())
    return [
        up,
        follow,
        leases,
        uptime,
        appended,
        commits,
        refused,
        frozen,
        *clients_first,
        build,
        scraped,
    ]


def _retention_families(rows: Sequence[dict[str, Any]]) -> list[Metric]:
    """Per path: its retention horizon, the offsets it keeps, and who holds it there."""
    horizon = GaugeMetricFamily(
        "streamkit_retention_horizon",
        "The lowest offset of the path retention must keep (docs/retention.md).",
        labels=["path"],
    )
    kept = GaugeMetricFamily(
        "streamkit_retention_kept_offsets",
        "Offsets from the path's horizon through its head: what its consumers still hold.",
        labels=["path"],
    )
    holds = GaugeMetricFamily(
        "streamkit_retention_holds", "Operator holds in force on the path.", labels=["path"]
    )
    held_by = GaugeMetricFamily(
        "streamkit_retention_held_by",
        "1 for each processor or hold that holds the path's horizon where it is.",
        labels=["path", "kind", "name", "why"],
    )
    start = GaugeMetricFamily(
        "streamkit_retention_start",
        "The first offset the path still holds (1 until retention took some of it).",
        labels=["path"],
    )
    segments = GaugeMetricFamily(
        "streamkit_retention_archived_segments",
        "Archive segments recorded for the path.",
        labels=["path"],
    )
    archived = GaugeMetricFamily(
        "streamkit_retention_archived_bytes",
        "Bytes of the path's recorded archive segments.",
        labels=["path"],
    )
    window = GaugeMetricFamily(
        "streamkit_retention_key_window_seconds",
        "How long keys of the path's taken events answer retries (absent: forever).",
        labels=["path"],
    )
    for row in rows:
        path = row["path"]
        if row.get("keys_kept_for") is not None:
            window.add_metric([path], float(row["keys_kept_for"]))
        start.add_metric([path], float(row["start"]))
        segments.add_metric([path], float(row["archived_segments"]))
        archived.add_metric([path], float(row["archived_bytes"]))
        horizon.add_metric([path], float(row["horizon"]))
        kept.add_metric([path], float(row["head"] + 1 - row["horizon"]))
        holds.add_metric([path], float(sum(1 for n in row["needs"] if n["kind"] == "hold")))
        for need in row["held_by"]:
            held_by.add_metric([path, need["kind"], need["name"], need["why"]], 1.0)
    return [horizon, kept, holds, held_by, start, segments, archived, window]


def _policy_families(job: dict[str, Any] | None) -> list[Metric]:
    """The retention job of this host: whether it holds the lease, and each policy's runs."""
    if job is None:
        return []
    holds = GaugeMetricFamily(
        "streamkit_retention_lease_held",
        "1 if this host holds the retention lease and runs the [[retention]] policies.",
    )
    holds.add_metric([], 1.0 if job["holds_lease"] else 0.0)
    runs = CounterMetricFamily(
        "streamkit_retention_policy_runs",
        "Runs of the path's retention policy on this host, by outcome (ok or failed).",
        labels=["path", "outcome"],
    )
    taken = CounterMetricFamily(
        "streamkit_retention_policy_events_taken",
        "Events the path's retention policy archived or deleted on this host.",
        labels=["path", "mode"],
    )
    forgotten = CounterMetricFamily(
        "streamkit_retention_policy_keys_forgotten",
        "Idempotency keys of taken events the path's key window let go, on this host's runs.",
        labels=["path"],
    )
    last = GaugeMetricFamily(
        "streamkit_retention_policy_last_run_timestamp_seconds",
        "When the path's policy last ran on this host (epoch seconds; absent before its first run).",
        labels=["path"],
    )
    for record in job["policies"]:
        path = record["path"]
        runs.add_metric([path, "ok"], float(record["runs"]))
        runs.add_metric([path, "failed"], float(record["failures"]))
        taken.add_metric([path, record["mode"]], float(record["events_taken"]))
        forgotten.add_metric([path], float(record["keys_forgotten"]))
        if record["last_at"] is not None:
            last.add_metric([path], float(record["last_at"]))
    return [holds, runs, taken, forgotten, last]


def _le(edge: float) -> str:
    return f"{edge:g}"
