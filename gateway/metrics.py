"""Gateway metrics (prometheus-client), one registry per app so tests can run several."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("lifeline_gateway_requests", "Requests by outcome", ["outcome"], registry=r)
        self.active = Gauge("lifeline_gateway_active_requests", "Requests being served", registry=r)
        self.engine_attempts = Counter("lifeline_gateway_engine_attempts", "Requests sent to engines (first tries and migrations)", registry=r)
        self.migrations = Counter("lifeline_gateway_migrations", "Streams moved to another engine, by failure reason", ["reason", "strategy"], registry=r)
        self.overload_resends = Counter(
            "lifeline_gateway_overload_resends", "Requests sent again after an engine answered 429 (its queue full): "
            "waits for room, not migrations", registry=r)
        self.recovery_failures = Counter("lifeline_gateway_recovery_failures", "Streams ended with a typed error", ["type"], registry=r)
        self.inexact_continuations = Counter(
            "lifeline_gateway_inexact_continuations", "Sampled streams continued on an engine that could not redraw "
            "them (no position-keyed sampler): their later chunks say continuation may_differ", registry=r)
        self.resumes = Counter("lifeline_gateway_resumes", "Client resumes with Last-Event-ID", ["mode"], registry=r)
        self.rejected = Counter("lifeline_gateway_admission_rejected", "Requests refused by admission", ["type"], registry=r)
        self.stale_frames = Counter("lifeline_gateway_stale_frames_dropped", "Frames dropped for an old epoch or generation", registry=r)
        self.recomputed_tokens = Counter("lifeline_gateway_recomputed_decode_tokens", "Decode tokens generated again after a failure", registry=r)
        self.reprefilled_tokens = Counter("lifeline_gateway_reprefilled_tokens", "Prompt tokens prefilled again after a failure", registry=r)
        self.suppressed = Counter("lifeline_gateway_endpoints_suppressed", "Endpoints suppressed locally after a failure", registry=r)
        self.lease_rejections = Counter("lifeline_gateway_lease_rejections", "Lease renewals refused", ["type"], registry=r)
        self.session_turns = Counter("lifeline_gateway_session_turns", "Session turns answered", ["session_class"], registry=r)
        self.session_context_tokens = Counter("lifeline_gateway_session_context_tokens", "Context tokens session turns carried (the prompt up to the last answer)", ["session_class"], registry=r)
        self.session_context_recomputed = Histogram(
            "lifeline_gateway_session_context_recomputed_tokens",
            "Context tokens a session turn prefilled again (context - engine cached_tokens); continuity=elsewhere: "
            "the previous turn was not recorded in this region, or its record is a replica (a failover)",
            ["session_class", "continuity"], buckets=(0, 16, 64, 256, 1024, 4096, 16384), registry=r,
        )
        self.session_checkpoints = Counter("lifeline_gateway_session_checkpoints", "Session KV checkpoints asked of engines, by outcome", ["session_class", "outcome"], registry=r)
        self.session_checkpointed_tokens = Counter("lifeline_gateway_session_checkpointed_tokens", "Context positions session checkpoints hold", ["session_class"], registry=r)
        self.recovery_gap = Histogram(
            "lifeline_gateway_recovery_gap_seconds", "Failure detected → next token committed",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r,
        )
        self.ttft = Histogram(
            "lifeline_gateway_time_to_first_token_seconds", "Request received → first token committed",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r,
        )
