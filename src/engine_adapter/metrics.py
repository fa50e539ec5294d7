"""The protocol's series on sglang's ``/metrics`` (``--enable-metrics``), made the way sglang makes its own.

sglang runs ``prometheus_client`` in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set before
its schedulers start) and serves every process's series from its HTTP server; each scheduler
labels its series ``model_name``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` (and ``dp_rank``, and
``--extra-metric-labels``): ``observability/metrics_collector.py``. The plugin's series are made in
each rank process the same way, under sglang's ``sglang:`` prefix:

- ``sglang:expert_layout_record_version`` (gauge): the layout version the rank routes with;
- ``sglang:expert_layout_chunks_committed_total``: chunks this rank's daemon recorded (every daemon's
  record is checked at the next all-gather; a failed check turns rebalancing off);
- ``sglang:expert_layout_rebalances_paused_total{reason}``: rebalances paused (a daemon busy: the
  daemon's reason, e.g. ``other_engine_attached``);
- ``sglang:expert_layout_begins_refused_total{reason}``: this rank's daemon refused a begin (its
  reason; ``unreachable`` when it did not answer), which turns shared rebalancing off;
- ``sglang:expert_layout_startups_total{outcome,reason}``: startup decisions (adopt, keep_own, fail);
- ``sglang:expert_layout_rebalance_protocol_seconds`` (histogram): time in the protocol (begin and
  commit round trips and all-gathers, not sglang's move) per rebalance;
- ``sglang:expert_layout_dirty_seen_total``: startups that found this rank's daemon dirty;
- ``sglang:expert_layout_hooks_missing`` (gauge): hooks sglang did not apply (``install_check``).

Nothing is created unless sglang's metrics are on (``setup`` at startup); otherwise every
function here returns at its first line. On the per-chunk path each call is one counter
increment or one addition (``make bench`` measures the cost).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from layout_sm.engine import EngineView, Go, RankAnswer

logger = logging.getLogger("engine_adapter")

PREFIX = "sglang:expert_layout_"
# Seconds in the protocol per rebalance: a chunk's round trips and all-gather take milliseconds.
PROTOCOL_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class EngineMetrics:
    """The plugin's series of one rank process, bound to that rank's labels."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        # Imported here, after sglang set PROMETHEUS_MULTIPROC_DIR (as sglang's collectors do).
        from prometheus_client import Counter, Gauge, Histogram

        names = list(labels)
        self.labels = dict(labels)

        def gauge(name: str, documentation: str) -> Any:
            """A rank's gauge: the value its latest process set (sglang's multiprocess mode for gauges)."""
            made = Gauge(f"{PREFIX}{name}", documentation, labelnames=names, multiprocess_mode="mostrecent")
            return made.labels(**labels)

        def counter(name: str, documentation: str, *by: str) -> Any:
            """A rank's counter; with ``by``, the family whose children those extra labels name."""
            made = Counter(f"{PREFIX}{name}", documentation, labelnames=[*names, *by])
            return made.labels(**labels) if not by else made

        self.record_version = gauge("record_version", "The expert-layout version this rank routes with.")
        self.chunks_committed = counter("chunks_committed", "Rebalance chunks this rank's daemon recorded.")
        self.paused = counter(
            "rebalances_paused", "Rebalances paused because a daemon was busy, by the daemon's reason.", "reason"
        )
        self.begins_refused = counter(
            "begins_refused", "Begins this rank's daemon refused (shared rebalancing then off), by reason.", "reason"
        )
        self.startups = counter("startups", "Startup decisions, by outcome and reason.", "outcome", "reason")
        self.protocol_seconds = Histogram(
            f"{PREFIX}rebalance_protocol_seconds",
            "Seconds in the expert-layout protocol (begin, commit, all-gathers) per rebalance.",
            labelnames=names,
            buckets=PROTOCOL_SECONDS_BUCKETS,
        ).labels(**labels)
        self.dirty_seen = counter("dirty_seen", "Startups that found this rank's daemon dirty.")
        self.hooks_missing = gauge(
            "hooks_missing", "Plugin hooks sglang did not apply (rebalancing of shared weights off when not 0)."
        )
        # The warm standby issue adds role and parked here (gauges, the same labels).
        self.protocol_s_this_rebalance = 0.0


_CREATED: EngineMetrics | None = None  # prometheus_client registers a name once per process
_ACTIVE: EngineMetrics | None = None


def sglang_metrics_on() -> bool:
    from sglang.srt.runtime_context import get_context, get_observability

    return get_context().is_config_namespace_published("observability") and bool(get_observability().enable_metrics)


def rank_labels() -> dict[str, str]:
    """sglang's scheduler labels (``SchedulerMetricsCollector.init_new``), as strings."""
    from sglang.srt.runtime_context import get_observability, get_parallel, get_serving

    parallel = get_parallel()
    labels = {
        "model_name": str(get_serving().served_model_name),
        "tp_rank": str(parallel.tp_rank),
        "pp_rank": str(parallel.pp_rank),
        "moe_ep_rank": str(parallel.moe_ep_rank),
    }
    if getattr(parallel, "dp_rank", None) is not None:
        labels["dp_rank"] = str(parallel.dp_rank)
    labels.update({str(k): str(v) for k, v in (get_observability().extra_metric_labels or {}).items()})
    return labels


def setup() -> EngineMetrics | None:
    """At startup, in each rank: the series when sglang's metrics are on, else None (nothing made)."""
    global _CREATED, _ACTIVE
    if not sglang_metrics_on():
        _ACTIVE = None
        return None
    if _CREATED is None:
        _CREATED = EngineMetrics(rank_labels())
    _ACTIVE = _CREATED
    _ACTIVE.protocol_s_this_rebalance = 0.0
    return _ACTIVE


def active() -> EngineMetrics | None:
    return _ACTIVE


def use(series: EngineMetrics | None) -> None:
    """Record into ``series`` (None: record nothing); ``setup`` does this at startup (and benchmarks)."""
    global _ACTIVE
    _ACTIVE = series


# -- the events (each returns at once when metrics are off) ----------------------------------------


def startup(view: EngineView, rank: int, hooks_missing: int) -> None:
    """The startup's decision, as the session's view holds it once the ranks agreed."""
    m = _ACTIVE
    outcome = view.outcome
    if m is None or outcome is None:
        return
    m.startups.labels(**m.labels, outcome=outcome.kind, reason=outcome.reason.value).inc()
    m.record_version.set(view.version)
    m.hooks_missing.set(hooks_missing)
    own = view.findings[rank]
    if own is not None and own.dirty:
        m.dirty_seen.inc()


class ChunkWatch:
    """The session's observer for the chunk series: each rank's begin answer as the session takes it,
    then the decision (a pause counts with the first busy daemon's reason; a refusal by this rank's
    daemon with its own), and each commit this rank's daemon recorded."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.answers: dict[int, RankAnswer] = {}

    def __call__(self, event: str, arguments: Mapping[str, Any], result: Any, view: Any) -> None:
        m = _ACTIVE
        if m is None:
            return
        if event == "begin":
            self.answers[int(arguments["rank"])] = arguments["answer"]
        elif event == "decide":
            answers, self.answers = self.answers, {}
            go = result.go
            if go is Go.PAUSE:
                busy = [a for _, a in sorted(answers.items()) if a.busy]
                m.paused.labels(**m.labels, reason=(busy[0].reason if busy else None) or "unreachable").inc()
            elif go is Go.STOP:
                own = answers.get(self.rank)
                if own is None or not (own.ok or own.busy):
                    m.begins_refused.labels(**m.labels, reason=(own and own.reason) or "unreachable").inc()
        elif event == "commit" and int(arguments["rank"]) == self.rank and arguments["answer"].ok:
            m.chunks_committed.inc()
            if arguments["answer"].version is not None:
                m.record_version.set(arguments["answer"].version)


def watch(session: Any, rank: int) -> None:
    """Count the session's chunks on this rank's series, when sglang's metrics are on."""
    if _ACTIVE is not None:
        session.observers.append(ChunkWatch(rank))


def protocol_time(seconds: float) -> None:
    m = _ACTIVE
    if m is not None:
        m.protocol_s_this_rebalance += seconds


def rebalance_ended() -> None:
    m = _ACTIVE
    if m is None or m.protocol_s_this_rebalance == 0.0:
        return
    m.protocol_seconds.observe(m.protocol_s_this_rebalance)
    m.protocol_s_this_rebalance = 0.0
