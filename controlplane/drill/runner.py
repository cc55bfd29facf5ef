"""Runs a drill on a fleet: steady traffic, one fault inside the blast radius, measure, report.

What each fault does, touches and alone measures is `controlplane/drill/faults.py`
(instance faults below, zone loss, control plane down, Redis down); this
module is what every drill shares.

Promise measured: request recovery and semantic recovery (ARCHITECTURE "three
promises"). Steady synthetic streaming traffic goes through the gateway with
the official `openai` client, alternating greedy and seeded requests, each
compared token by token with an undisturbed run made just before. The fault
lands once `traffic.fault_after_tokens` tokens have reached the client, on
one instance the blast radius names:

    sigkill          the fleet kills the process (SIGKILL; the pool driver in production)
    sigstop          the fleet stops the engine (SIGSTOP; stock vLLM: its engine core), SIGCONT to undo
    hang             the engine's fault admin: POST /admin/faults {"hang_after_tokens": now}
    corrupt_weights  the engine's fault admin: POST /admin/faults {"corrupt_weights": true}

Lifeline recovers on its own (the gateway migrates the streams); the runner
only watches. Stop conditions (error rate, TTFT p99) are checked every time a
request finishes; one crossed stops the traffic, rolls the fault back
(faults cleared; a stopped engine continued; a killed or corrupted instance
restarted) and aborts the run.
After the traffic, the fault is rolled back the same way, a canary (the
greedy request, straight to each instance) measures RTO_quality, the
`routing.tier` events written since the drill began are read back in order,
and the run ends `passed` or `failed` with its report.

A fault target outside the blast radius is refused before anything is
touched (`OutsideBlastRadius`), and the run is aborted with that reason.

Where the fleet resolves its gateway (`Fleet.resolve_gateway`: a region
drill's DNS name, asked of the authoritative server), every attempt asks it
again; with `traffic.retry_for_s` a broken request is sent again from
scratch, as a client would after its connection broke (`_stream`).

Each state change is its own unit of work (commit per step, like cutover
flows), so `GET /api/v1/drills/runs/{id}` shows `running` while traffic flows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import httpx
from sqlalchemy.orm import Session, sessionmaker

from common.clock import Clock
from common.logs import get_logger
from controlplane.db import session_scope
from controlplane.drill import faults, measure, metrics, service
from controlplane.drill.engines import evidence as engine_evidence
from controlplane.drill.engines import instance_generation
from controlplane.drill.errors import ApprovalRequired, OutsideBlastRadius, UnsupportedDrill
from controlplane.drill.faults import check_blast_radius
from controlplane.drill.measure import RequestTrace
from controlplane.drill.schemas import BlastRadius, StopConditions, Targets, Traffic
from controlplane.drill.states import DrillFault, DrillRunEvent, DrillRunState, DrillScope, may_start

log = get_logger(__name__)

RUNNER_ACTOR = "drill-runner"
RECOMPUTED = "lifeline_gateway_recomputed_decode_tokens_total"
# The session headers of contract/session.py (SESSION_HEADER, SESSION_CLASS_HEADER); spelled here so a drill
# still runs against a gateway built before sessions (which ignores them, and then RPO_context stays unmeasured).
# RPO_context is read from each turn's `lifeline.session` (measure.rpo_context), not from the gateways'
# histogram: that one sums every turn's re-prefilled partial block, fault or not.
SESSION_HEADER = "x-session-id"
SESSION_CLASS_HEADER = "x-session-class"


class Fleet(Protocol):
    """The serving fleet a drill acts on: local processes here, the pool driver in production."""

    gateway_url: str

    def instance_ids(self) -> list[str]: ...

    def engine_url(self, instance_id: str) -> str: ...

    def served_model(self, instance_id: str) -> str:
        """The model name the engine itself answers to (for the canary, sent straight to it)."""

    def kill(self, instance_id: str) -> None:
        """SIGKILL the instance's process."""

    def restart(self, instance_id: str) -> None:
        """Bring the instance back (new generation) and wait until it is routable again."""

    # sigstop drills also need `stop(instance_id)` (SIGSTOP the engine: stock vLLM's engine core) and
    # `resume(instance_id)` (SIGCONT); a fleet without them is refused such a drill (faults.plan_fault).


class EventReader(Protocol):
    def last_id(self) -> int: ...

    def events_after(self, after_id: int) -> list[dict[str, Any]]: ...


class HttpEventReader:
    """Reads the control plane's event log over GET /api/v1/events (viewer token)."""

    def __init__(self, controlplane_url: str, token: str, *, timeout: float = 5.0) -> None:
        self.url = controlplane_url.rstrip("/") + "/api/v1/events"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout = timeout

    def _page(self, after_id: int) -> list[dict[str, Any]]:
        response = httpx.get(self.url, params={"after_id": after_id, "limit": 1000}, headers=self.headers,
                             timeout=self.timeout)
        response.raise_for_status()
        return sorted(response.json(), key=lambda e: e["id"])

    def last_id(self) -> int:
        return max((e["id"] for e in self.events_after(0)), default=0)

    def events_after(self, after_id: int) -> list[dict[str, Any]]:
        """Every event after `after_id`, oldest first, a page of 1000 at a time."""
        out: list[dict[str, Any]] = []
        while page := self._page(after_id):
            out.extend(page)
            after_id = page[-1]["id"]
        return out


@dataclass
class DrillOutcome:
    run_id: int
    state: DrillRunState
    report: dict[str, Any]


@dataclass
class _Live:
    traces: list[RequestTrace] = field(default_factory=list)
    tokens_seen: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


__all__ = ["DrillOutcome", "DrillRunner", "HttpEventReader", "InstanceDrillRunner", "check_blast_radius",
           "stop_condition_tripped"]


def stamp_fault(clock: Clock, inject: Callable[[], object]) -> tuple[float, float, float]:
    """Run the fault's action, then stamp it: (monotonic, wall, seconds the action took).

    The moment the fault took effect is when its action returned (the
    SIGKILLs delivered, the engine's fault admin answered), not when the
    runner decided to send it: stamped before, `detection_s` included the
    runner's own round trips (the hang fault's two admin calls, ~40 ms of
    a reported ~40 ms).
    """
    sent = clock.now()
    inject()
    fault_at, fault_wall = clock.now(), clock.wall()
    return fault_at, fault_wall, fault_at - sent


class DrillRunner:
    """One drill run, start to report. `run()` is blocking (a Celery task or a CLI command calls it).

    The fault itself, its footprint and its own measurements are a
    `faults.FaultPlan`; this class owns what every drill shares: the
    approval check, the undisturbed run, the traffic, the stop conditions,
    the rollback, the canary, the event log and the report.
    """

    def __init__(self, *, factory: sessionmaker[Session], fleet: Fleet, clock: Clock,
                 events: EventReader | None = None, model: str | None = None,
                 sleep: Callable[[float], None] = time.sleep, canary_timeout: float = 60.0,
                 report_dir: Any = None) -> None:
        self.factory = factory
        self.fleet = fleet
        self.clock = clock
        self.events = events
        self.model = model
        self.sleep = sleep
        self.canary_timeout = canary_timeout
        self.report_dir = report_dir

    # -- orchestration ------------------------------------------------------
    def run(self, run_id: int, *, target: str | None = None) -> DrillOutcome:
        with session_scope(self.factory) as session:
            run = service.get_run_or_raise(session, run_id=run_id, fresh=True)
            definition = run.definition
            scope, fault = DrillScope(definition.scope), DrillFault(definition.fault)
            radius = BlastRadius.model_validate(definition.blast_radius)
            stops = StopConditions.model_validate(definition.stop_conditions)
            targets = Targets.model_validate(definition.targets)
            traffic = Traffic.model_validate(definition.traffic)
            model_name = self.model or definition.model
            meta = {"drill": definition.name, "version": definition.version, "run": run.id, "model": definition.model,
                    "scope": scope.value, "fault": fault.value, "region": definition.region,
                    "expected_tier": definition.expected_tier, "blast_radius": radius.model_dump(mode="json"),
                    "stop_conditions": stops.model_dump(mode="json")}
            # Zone and region drills start only once a person approved this run; nothing is touched before.
            if not may_start(scope, approved=run.approved_by is not None):
                raise ApprovalRequired(f"drill run {run.id} is a {scope} drill in state {run.state}: an operator "
                                       "must approve it before it starts")
        try:
            plan = faults.plan_fault(scope=scope, fault=fault, radius=radius, traffic=traffic, fleet=self.fleet,
                                     target=target, clock=self.clock, sleep=self.sleep,
                                     probe=lambda: self._probe(model_name, traffic),
                                     expected_tier=meta["expected_tier"])
            prepare = getattr(plan, "prepare", None)
            if prepare is not None:
                prepare()
        except (OutsideBlastRadius, UnsupportedDrill) as refused:
            with session_scope(self.factory) as session:
                service.abort(session, run_id=run_id, reason=f"refused: {refused}", actor=RUNNER_ACTOR,
                              clock=self.clock)
            metrics.RUNS.labels(scope=scope.value, fault=fault.value, outcome="refused").inc()
            raise
        # Which engines serve, and whether they sample by position (before the fault, while every one answers):
        # the SLO document says "token-identical" only for what this shows (controlplane/drill/engines.py).
        meta["engines"] = engine_evidence(self.fleet, self.fleet.instance_ids())
        # An instance drill's events name the incarnation it faults (the run's fault_generation).
        fault_generation = instance_generation(self.fleet, plan.target) if scope == DrillScope.INSTANCE else None
        meta["fault_generation"] = fault_generation
        with session_scope(self.factory) as session:
            service.start(session, run_id=run_id, fault_target=plan.target, actor=RUNNER_ACTOR, clock=self.clock,
                          fault_generation=fault_generation)

        try:
            outcome = self._drive(run_id, meta, model_name, plan, stops, targets, traffic)
        except Exception as error:
            log.error("drill_failed", run=run_id, error=repr(error))
            plan.clear()
            with session_scope(self.factory) as session:
                run = service.get_run_or_raise(session, run_id=run_id, fresh=True)
                if run.state == DrillRunState.RUNNING:
                    service.advance(session, run=run, event=DrillRunEvent.ERROR, clock=self.clock,
                                    failure=repr(error)[:2000])
            metrics.RUNS.labels(scope=scope.value, fault=fault.value, outcome="error").inc()
            raise
        metrics.RUNS.labels(scope=scope.value, fault=fault.value, outcome=outcome.state.value).inc()
        for metric, value in outcome.report["measured"].items():
            if value is not None:
                metrics.MEASURED.labels(drill=meta["drill"], metric=metric).set(value)
        log.info("drill_ended", run=run_id, state=outcome.state.value, measured=outcome.report["measured"])
        return outcome

    def _drive(self, run_id: int, meta: dict[str, Any], model_name: str, plan: faults.FaultPlan,
               stops: StopConditions, targets: Targets, traffic: Traffic) -> DrillOutcome:
        first_event = self.events.last_id() if self.events is not None else 0
        baselines = {mode: self._baseline(model_name, traffic, mode) for mode in ("greedy", "seeded")}
        expected = {mode: trace.token_ids for mode, trace in baselines.items()}
        baseline_ttft = [t.ttft for t in baselines.values() if t.ttft is not None]
        # Multi-turn sessions: the undisturbed conversation per mode, every turn's ids (turn 0 is `expected`'s
        # prompt as a chat message, so it is a conversation of its own, not the completions baseline).
        conversations = ({mode: self._conversation_baseline(model_name, traffic, mode) for mode in ("greedy", "seeded")}
                         if traffic.multi_turn else {})
        expected_turns = {mode: [t.token_ids for t in turns] for mode, turns in conversations.items()}
        baseline_ttft += [t.ttft for turns in conversations.values() for t in turns if t.ttft is not None]
        engines = faults._Engines(self.fleet)
        slowed = (plan.slow if plan.slow is not None else plan.prefer) if traffic.token_delay_ms else []
        for instance in slowed:
            # Slow the victims' tokens so the fault lands mid-stream; inside the blast radius, rolled back below.
            engines.admin(instance, {"token_delay_ms": traffic.token_delay_ms})
        gateways = faults._gateway_urls(self.fleet)
        # The gateways' own count of decode tokens generated again after a failure (token RPO's recomputed part).
        recomputed_before = faults.gateway_metric(gateways, RECOMPUTED)
        live = _Live()
        fault_at: float | None = None
        fault_wall: float | None = None
        cleared_at: float | None = None
        tripped: str | None = None

        def one(index: int) -> None:
            if live.stop.is_set():
                return
            if traffic.multi_turn:
                conversation(index)
                return
            mode = "greedy" if index % 2 == 0 else "seeded"
            trace = RequestTrace(index=index, sampling=mode, started_at=self.clock.now())
            with live.lock:
                live.traces.append(trace)
            prefer = plan.prefer[index % len(plan.prefer)] if plan.prefer else None
            session = f"drill-{run_id}-{index}" if traffic.sessions else None
            self._stream(model_name, traffic, mode, trace, live, prefer=prefer, session=session)

        def conversation(index: int) -> None:
            """One session of `session_turns` chat turns; a turn that failed ends it (the next has no answer)."""
            mode = "greedy" if index % 2 == 0 else "seeded"
            classes = traffic.session_classes
            session_class = classes[index % len(classes)] if classes else None
            prefer = plan.prefer[index % len(plan.prefer)] if plan.prefer else None
            answers: list[str] = []
            for turn in range(traffic.session_turns):
                if turn and traffic.session_think_s:
                    self.sleep(traffic.session_think_s)
                if live.stop.is_set():
                    return
                trace = RequestTrace(index=index * traffic.session_turns + turn, sampling=mode,
                                     started_at=self.clock.now(), session_id=f"drill-{run_id}-{index}",
                                     session_class=session_class, turn=turn)
                with live.lock:
                    live.traces.append(trace)
                self._stream(model_name, traffic, mode, trace, live, prefer=prefer, session=trace.session_id,
                             messages=chat_messages(traffic, answers))
                if trace.error:
                    return
                answers.append(trace.text)

        injection_s = 0.0

        def inject() -> None:
            nonlocal fault_at, fault_wall, injection_s
            metrics.FAULTS.labels(fault=plan.fault.value).inc()
            fault_at, fault_wall, injection_s = stamp_fault(self.clock, plan.inject)

        next_abort_check = self.clock.now()
        operator_abort: str | None = None
        futures: list[Future[None]] = []
        submitted = 0
        with ThreadPoolExecutor(max_workers=traffic.concurrency, thread_name_prefix="drill-traffic") as pool:
            while True:
                # Steady traffic: `concurrency` streams at a time, `requests` at least; an outage fault that
                # keeps traffic going gets more until it is cleared.
                in_flight = sum(1 for f in futures if not f.done())
                held = plan.keep_traffic and cleared_at is None
                while not tripped and in_flight < traffic.concurrency and (submitted < traffic.requests or held):
                    futures.append(pool.submit(one, submitted))
                    submitted += 1
                    in_flight += 1
                # An outage fault stays on for its whole hold, traffic or not; the others end with the traffic.
                outage = plan.hold_s is not None and cleared_at is None
                traffic_done = submitted >= traffic.requests and (plan.keep_traffic or in_flight == 0)
                if in_flight == 0 and not (outage and not tripped):
                    break
                now = self.clock.now()
                if fault_at is None and (live.tokens_seen >= traffic.fault_after_tokens
                                         or (outage and traffic_done)):
                    inject()
                elif fault_at is not None and cleared_at is None:
                    plan.tick(now)
                    if plan.hold_s is not None and now >= fault_at + plan.hold_s:
                        plan.clear()
                        cleared_at = self.clock.now()
                with live.lock:
                    snapshot = [t for t in live.traces if not plan.documented_refusal(t)]
                tripped = tripped or self._stop_condition(stops, snapshot)
                if not tripped and self.clock.now() >= next_abort_check:
                    next_abort_check = self.clock.now() + 0.5
                    operator_abort = self._aborted_by_operator(run_id)
                    tripped = operator_abort
                if tripped:
                    live.stop.set()
                    break
                self.sleep(0.02)
            if tripped:
                for future in futures:
                    future.cancel()  # not started yet: never sent; in flight: finish (the gateway bounds them)
        if fault_at is None:  # traffic ended before the threshold: fault now so the drill still drills
            inject()
        assert fault_at is not None and fault_wall is not None
        if cleared_at is None:
            plan.clear()
            cleared_at = self.clock.now()
        plan.after_clear()
        for instance in slowed if plan.slow is not None else []:
            engines.admin(instance, {})  # instances the plan does not restart: the token delay taken off
        traces = sorted(live.traces, key=lambda t: t.index)
        recomputed = faults.gateway_metric(gateways, RECOMPUTED) - recomputed_before
        report = self._report(meta, plan, traces, expected, fault_at, fault_wall, cleared_at, first_event, targets,
                              baseline_ttft, tripped, model_name, traffic, recomputed=recomputed,
                              expected_turns=expected_turns, injection_s=injection_s)
        if operator_abort:  # already aborted through the API; the fault is rolled back, the row is final
            return DrillOutcome(run_id, DrillRunState.ABORTED, report)
        with session_scope(self.factory) as session:
            if tripped:
                run = service.abort(session, run_id=run_id, reason=f"stop condition: {tripped}", actor=RUNNER_ACTOR,
                                    clock=self.clock, report=report)
                return DrillOutcome(run_id, DrillRunState(run.state), report)
            run = service.get_run_or_raise(session, run_id=run_id, fresh=True)
            run = service.advance(session, run=run, event=DrillRunEvent.FAULT_CLEARED, clock=self.clock)
        with session_scope(self.factory) as session:
            run = service.get_run_or_raise(session, run_id=run_id, fresh=True)
            event = DrillRunEvent.PASS if report["passed"] else DrillRunEvent.FAIL
            run = service.advance(session, run=run, event=event, clock=self.clock, report=report,
                                  failure=None if report["passed"] else "; ".join(report["follow_ups"])[:2000])
            return DrillOutcome(run_id, DrillRunState(run.state), report)

    # -- traffic ------------------------------------------------------------
    def _client(self, gateway_url: str) -> Any:
        import openai  # the official client: the drill speaks to the gateway as any customer does

        return openai.OpenAI(base_url=gateway_url.rstrip("/") + "/v1", api_key="drill",
                             max_retries=0, timeout=120.0)

    @staticmethod
    def _body(traffic: Traffic, mode: str) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": traffic.max_tokens, "temperature": 0.0}
        extra: dict[str, Any] = {"ignore_eos": True, "return_token_ids": True}
        if mode == "seeded":
            body.update(temperature=1.0, top_p=0.95, seed=traffic.seed)
        return {**body, "extra_body": extra}

    def _baseline(self, model_name: str, traffic: Traffic, mode: str) -> RequestTrace:
        """The undisturbed run every drill request is compared with, token by token."""
        trace = RequestTrace(index=-1, sampling=mode, started_at=self.clock.now())
        self._stream(model_name, traffic, mode, trace, _Live(), prefer=None)
        if trace.error:
            raise RuntimeError(f"the undisturbed {mode} run failed: {trace.error}")
        return trace

    def _conversation_baseline(self, model_name: str, traffic: Traffic, mode: str) -> list[RequestTrace]:
        """The undisturbed conversation (no session header: nothing checkpointed, nothing counted)."""
        turns: list[RequestTrace] = []
        for turn in range(traffic.session_turns):
            trace = RequestTrace(index=-1, sampling=mode, started_at=self.clock.now(), turn=turn)
            self._stream(model_name, traffic, mode, trace, _Live(), prefer=None,
                         messages=chat_messages(traffic, [t.text for t in turns]))
            if trace.error:
                raise RuntimeError(f"the undisturbed {mode} conversation failed at turn {turn}: {trace.error}")
            turns.append(trace)
        return turns

    def _gateway(self) -> str:
        """Where the next attempt goes: the fleet's resolver when it has one (a DNS name), else its gateway."""
        resolve = getattr(self.fleet, "resolve_gateway", None)
        return resolve() if resolve is not None else self.fleet.gateway_url

    def _stream(self, model_name: str, traffic: Traffic, mode: str, trace: RequestTrace, live: _Live,
                prefer: str | None, session: str | None = None,
                messages: list[dict[str, str]] | None = None) -> None:
        """One request, start to end; with `traffic.retry_for_s`, failed attempts are sent again from scratch.

        A retry is what a client does after its connection broke: it re-resolves (`_gateway`) and asks
        again. Every token any attempt delivered keeps its arrival time (the gap at the client spans the
        attempts); the ids are the last attempt's, and the tokens an abandoned attempt had delivered are
        counted as delivered twice (`discarded_tokens`).
        """
        deadline = trace.started_at + traffic.retry_for_s
        try:
            while True:
                error = self._attempt(model_name, traffic, mode, trace, live, prefer, session, messages)
                if error is None or live.stop.is_set() or self.clock.now() + traffic.retry_backoff_s > deadline:
                    trace.error = error
                    return
                trace.discarded_tokens += len(trace.token_ids)
                trace.token_ids, trace.seqs, trace.text, trace.session = [], [], "", None
                trace.epochs += [trace.epochs[-1] if trace.epochs else 0] * (len(trace.token_times)
                                                                              - len(trace.epochs))
                trace.attempts += 1
                self.sleep(traffic.retry_backoff_s)
        finally:
            trace.ended_at = self.clock.now()

    def _attempt(self, model_name: str, traffic: Traffic, mode: str, trace: RequestTrace, live: _Live,
                 prefer: str | None, session: str | None,
                 messages: list[dict[str, str]] | None = None) -> str | None:
        """One attempt of a request (a chat turn when `messages`); None if it delivered every token, else why not."""
        headers = {"X-Lifeline-Prefer-Instance": prefer} if prefer else {}
        if session is not None:
            headers[SESSION_HEADER] = session
            if trace.session_class:
                headers[SESSION_CLASS_HEADER] = trace.session_class
        retried = trace.attempts - 1
        got = 0
        try:
            gateway = self._gateway()
            trace.gateways.append(gateway)
            client = self._client(gateway)
            if messages is None:
                stream = client.completions.create(model=model_name, prompt=traffic.prompt, stream=True,
                                                   extra_headers=headers, **self._body(traffic, mode))
            else:  # the usage chunk carries the turn's `lifeline.session` (what the engine restored)
                stream = client.chat.completions.create(model=model_name, messages=messages, stream=True,
                                                        stream_options={"include_usage": True},
                                                        extra_headers=headers, **self._body(traffic, mode))
            for chunk in stream:
                now = self.clock.now()
                lifeline = (chunk.model_extra or {}).get("lifeline") or {}
                if "session" in lifeline:
                    trace.session = dict(lifeline["session"])
                for choice in chunk.choices:
                    delta = getattr(choice, "delta", None)
                    trace.text += (getattr(delta, "content", None) or "") if delta is not None else ""
                    ids = (choice.model_extra or {}).get("token_ids") or []
                    for token_id in ids:
                        trace.token_times.append(now)
                        trace.token_ids.append(int(token_id))
                    got += len(ids)
                    if ids:
                        with live.lock:
                            live.tokens_seen += len(ids)
                        if "seq" in lifeline:
                            trace.seqs.append(int(lifeline["seq"]))
                        if "epoch" in lifeline or retried:
                            # A retried attempt is another stream: its tokens count as moved (epoch ≥ 1).
                            trace.epochs.append(int(lifeline.get("epoch", 0)) + retried)
            if got < traffic.max_tokens:
                return f"stream ended after {got} of {traffic.max_tokens} tokens"
            return None
        except Exception as error:  # noqa: BLE001 - openai.APIError, transport errors alike: the request is lost
            # The stable error type the gateway sent (openai.APIError.type), so a documented refusal is told apart.
            kind = getattr(error, "type", None)
            return f"{type(error).__name__}: {f'[{kind}] ' if kind else ''}{error}"[:500]

    def _probe(self, model_name: str, traffic: Traffic) -> str | None:
        """One new stream through the gateway: None if it was served in full, else its error."""
        trace = RequestTrace(index=-2, sampling="greedy", started_at=self.clock.now())
        self._stream(model_name, traffic, "greedy", trace, _Live(), prefer=None)
        return trace.error

    # -- stop conditions ----------------------------------------------------
    @staticmethod
    def _stop_condition(stops: StopConditions, traces: list[RequestTrace]) -> str | None:
        return stop_condition_tripped(stops, traces)

    def _aborted_by_operator(self, run_id: int) -> str | None:
        with session_scope(self.factory) as session:
            run = service.get_run_or_raise(session, run_id=run_id, fresh=True)
            if run.state == DrillRunState.ABORTED:
                return f"aborted by an operator: {run.abort_reason}"
        return None

    # -- measuring ----------------------------------------------------------
    def _canary(self, model_name: str, traffic: Traffic, expected: list[int]) -> float | None:
        """Until every serving instance answers the greedy request as the undisturbed run did; when (clock.now)."""
        deadline = self.clock.now() + self.canary_timeout
        body = {"model": model_name, "prompt": traffic.prompt, "max_tokens": traffic.max_tokens,
                "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
        while self.clock.now() < deadline:
            passed = True
            for instance in self.fleet.instance_ids():
                try:
                    response = httpx.post(self.fleet.engine_url(instance) + "/v1/completions",
                                          json={**body, "model": self.fleet.served_model(instance)}, timeout=30.0)
                    ok = response.status_code == 200 and response.json()["choices"][0]["token_ids"] == expected
                except (httpx.HTTPError, KeyError, ValueError):
                    ok = False
                passed = passed and ok
            if passed:
                return self.clock.now()
            self.sleep(0.2)
        return None

    def _report(self, meta: dict[str, Any], plan: faults.FaultPlan, traces: list[RequestTrace],
                expected: dict[str, list[int]], fault_at: float, fault_wall: float, cleared_at: float,
                first_event: int, targets: Targets, baseline_ttft: list[float], tripped: str | None, model_name: str,
                traffic: Traffic, recomputed: float | None = None,
                expected_turns: dict[str, list[list[int]]] | None = None,
                injection_s: float = 0.0) -> dict[str, Any]:
        def expected_of(trace: RequestTrace) -> list[int]:
            return expected_turns[trace.sampling][trace.turn] if expected_turns else expected[trace.sampling]

        comparisons = [measure.compare_tokens(expected_of(t), t.token_ids, t.seqs) for t in traces if not t.error]
        # Only from session turns that carried context across the fault, as the gateway reported them.
        context = measure.rpo_context(traces, fault_at)
        refused = [t for t in traces if t.error and plan.documented_refusal(t)]
        lost = [t for t in traces if t.error and not plan.documented_refusal(t)]
        quality_at = None if tripped else self._canary(model_name, traffic, expected["greedy"])
        events = self.events.events_after(first_event) if self.events is not None else []
        routing_events = [e for e in events if e.get("routing_tier")]
        event_offsets = []
        for event in routing_events:
            offset = datetime.fromisoformat(event["started_at"]).timestamp() - fault_wall
            event_offsets.append((round(offset, 4), f"{event['routing_tier']} {event['kind']}"))
        detection = (measure.detection([offset for offset, _ in event_offsets], injection_s=injection_s)
                     if plan.expects_tier else None)
        if detection is None and plan.expects_tier:  # no event log: the first migrated token at the client
            moved = [tt for t in traces for tt, ep in zip(t.token_times, _epoch_per_token(t), strict=False) if ep > 0]
            detection = (min(moved) - fault_at) if moved else None
        ttft_target = (targets.ttft_target_ms / 1000.0 if targets.ttft_target_ms
                       else 3 * max(baseline_ttft, default=1.0))
        traffic_end = max([fault_at, *(t.ended_at for t in traces if t.ended_at is not None)])
        measured: dict[str, float | None] = {
            "detection_s": detection,
            "request_rto_s": measure.request_rto(traces, fault_at),
            "rto_latency_s": measure.rto_latency(
                traces, fault_at=fault_at, end_at=traffic_end, ttft_target=ttft_target,
                window_s=targets.ttft_window_s, min_samples=targets.ttft_window_min_samples),
            "rto_quality_s": (quality_at - fault_at) if quality_at is not None else None,
            # A from-scratch retry delivers again what the abandoned attempt had delivered: duplicates.
            "token_rpo_tokens": float(sum(c.rpo_tokens for c in comparisons) + sum(t.discarded_tokens
                                                                                   for t in traces)),
            "requests_lost": float(len(lost)),
            "recomputed_decode_tokens": recomputed,
            # The worst session's re-prefilled context after the fault (None: no session carried any: unverified).
            "rpo_context_tokens": context.tokens,
            **plan.measurements(fault_at, cleared_at),
        }
        target_values = {"request_rto_s": targets.request_rto_s, "rto_latency_s": targets.rto_latency_s,
                         "rto_quality_s": targets.rto_quality_s,
                         "rpo_context_tokens": None if targets.rpo_context_tokens is None
                         else float(targets.rpo_context_tokens),
                         "token_rpo_tokens": None if targets.token_rpo_tokens is None else float(targets.token_rpo_tokens),
                         "requests_lost": 0.0, **plan.targets()}
        verdicts = measure.verdicts(measured, target_values)
        follow_ups = [f"{v.metric}: measured {_fmt(v.measured)} vs target {_fmt(v.target)}"
                      for v in verdicts if v.met is False]
        # the tiers that acted on this fault; earlier events stay in the report's timeline (event_offsets)
        tiers = [e["routing_tier"] for e, (offset, _) in zip(routing_events, event_offsets, strict=True)
                 if measure.since_fault(offset, injection_s=injection_s)]
        if self.events is not None and plan.expects_tier and meta["expected_tier"] not in tiers:
            follow_ups.append(f"expected the {meta['expected_tier']} tier to act; events showed {tiers or 'none'}")
        follow_ups += plan.checks()
        if tripped:
            follow_ups.insert(0, f"aborted by stop condition: {tripped}; fault rolled back")
        report = {
            **meta,
            "fault_target": plan.target,
            "faulted_instances": list(plan.instances),
            "fault_cleared_at_s": round(cleared_at - fault_at, 4),
            "requests_during_fault": sum(1 for t in traces if t.started_at < cleared_at
                                         and (t.ended_at is None or t.ended_at > fault_at)),
            "refused_as_documented": len(refused),
            "fault_details": plan.details(),
            "passed": not follow_ups and not tripped,
            "aborted": tripped,
            "fault_at_s": 0.0,
            # How long the fault's own action took (kills, an admin call); the fault is stamped when it returned.
            "fault_injection_s": round(injection_s, 4),
            "measured": measured,
            "targets": target_values,
            "verdicts": [v.__dict__ for v in verdicts],
            "follow_ups": follow_ups,
            "requests": len(traces),
            "migrated_streams": measure.migrated(traces),
            "retried_requests": sum(1 for t in traces if t.attempts > 1),
            "tokens_redelivered_by_retry": sum(t.discarded_tokens for t in traces),
            "ttft_p99_s": measure.ttft_p99(traces),
            "rto_latency_window": {"target_s": ttft_target, "window_s": targets.ttft_window_s,
                                   "min_samples": targets.ttft_window_min_samples,
                                   "samples": len(measure.ttft_samples(traces, ttft_target))},
            "sessions": traffic.sessions,
            "session_turns": traffic.session_turns if traffic.sessions else 0,
            "rpo_context_by_class": context.by_class,
            "rpo_context_sessions": [r.__dict__ for r in context.sessions],
            "error_rate": measure.error_rate(traces),
            "events": [{k: e.get(k) for k in ("id", "kind", "routing_tier", "actor", "reason", "scope",
                                                "started_at", "outcome")} for e in events],
            "routing_tiers_in_order": tiers,
            "event_offsets": event_offsets,
            # The timeline, relative to the fault (seconds): one row per request for the plot.
            "timeline": [{"index": t.index, "sampling": t.sampling, "start": t.started_at - fault_at,
                          "end": (t.ended_at - fault_at) if t.ended_at is not None else None,
                          "tokens": [round(x - fault_at, 4) for x in t.token_times],
                          "epochs": _epoch_per_token(t), "error": t.error, "attempts": t.attempts,
                          "gateways": list(dict.fromkeys(t.gateways)),
                          **({"session_id": t.session_id, "turn": t.turn, "session": t.session}
                             if t.session_id else {})} for t in traces],
        }
        if self.report_dir is not None:
            from controlplane.drill.report import export_report

            report["files"] = [str(p) for p in export_report(report, self.report_dir)]
        return report


def chat_messages(traffic: Traffic, answers: list[str]) -> list[dict[str, str]]:
    """The messages of the turn after `answers`: the prompt, then each answer and the next follow-up."""
    messages = [{"role": "user", "content": traffic.prompt}]
    for i, answer in enumerate(answers):
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": traffic.follow_ups[i % len(traffic.follow_ups)]}]
    return messages


def stop_condition_tripped(stops: StopConditions, traces: list[RequestTrace]) -> str | None:
    """Pure: the first stop condition crossed by the finished requests, or None."""
    finished = [t for t in traces if t.finished]
    if len(finished) < stops.min_requests:
        return None
    rate = measure.error_rate(finished)
    if stops.max_error_rate is not None and rate > stops.max_error_rate:
        return f"error rate {rate:.2f} > {stops.max_error_rate:.2f}"
    p99 = measure.ttft_p99(finished)
    if stops.ttft_p99_ms is not None and p99 is not None and p99 * 1000.0 > stops.ttft_p99_ms:
        return f"TTFT p99 {p99 * 1000.0:.1f} ms > {stops.ttft_p99_ms:.3f} ms"
    return None


def _epoch_per_token(trace: RequestTrace) -> list[int]:
    """One epoch per token that reached the client (every attempt's): recorded per chunk carrying tokens, and
    chunks carry one token each on the gateway; padded with the last one where a chunk said none."""
    n = len(trace.token_times)
    if len(trace.epochs) >= n:
        return trace.epochs[:n]
    return trace.epochs + [trace.epochs[-1] if trace.epochs else 0] * (n - len(trace.epochs))


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


# The name the instance drills were first written under (tasks, CLI, demo and tests call it).
InstanceDrillRunner = DrillRunner
