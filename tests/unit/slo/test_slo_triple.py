"""The SLO document's lost / kept / recovery text comes from the drills, the engines and the policies."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from contract.sampling import SAMPLER_ID
from controlplane.drill import engines
from controlplane.slo import triple


@dataclass
class Run:
    id: int
    scope: str
    state: str = "passed"
    report: dict[str, Any] = field(default_factory=dict)


@dataclass
class Policy:
    session_class: str
    mode: str
    rpo_context_seconds: int = 30
    rpo_context_turns: int | None = None
    revision: int = 1


def ran(run_id: int, scope: str, *, lost: float = 0, migrated: int = 2, state: str = "passed",
        seen: dict[str, Any] | None = None) -> Run:
    report: dict[str, Any] = {"measured": {"requests_lost": lost, "token_rpo_tokens": 0.0},
                              "migrated_streams": migrated}
    if seen is not None:
        report["engines"] = seen
    return Run(run_id, scope, state, report)


def test_without_drills_every_scope_says_never_drilled_and_a_region_loss_ends_its_streams() -> None:
    lost, kept, recovery = triple.kv_texts([], [])
    parts = recovery.split("; ")
    assert [p.split(":")[0] for p in parts] == ["instance", "zone", "region"]
    assert all(p.endswith("(never drilled: unverified)") for p in parts)
    region = parts[2]
    assert "end with the region" in region and "continue" not in region
    assert "no replication policy" in kept


def test_a_region_loss_says_how_long_the_dns_tiers_records_keep_the_old_answer() -> None:
    unknown = triple.kv_texts([], [])[2].split("; ")[2]
    assert "no dns tier is configured here" in unknown
    external = triple.kv_texts([], [], triple.DnsTtls(60))[2].split("; ")[2]
    assert "within 60 s of the cutover (the external record's TTL)" in external and "internal" not in external
    both = triple.kv_texts([], [], triple.DnsTtls(30, 900))[2].split("; ")
    assert len(both) == 3
    assert "within 30 s of the cutover" in both[2] and "internal record, within 900 s" in both[2]
    assert "through a DNS outage" in both[2]


def test_drilled_scopes_cite_their_runs_and_what_they_measured() -> None:
    runs = [ran(9, "region", lost=3, migrated=0), ran(7, "instance"), ran(5, "instance", lost=4)]  # newest first
    recovery = triple.kv_texts(runs, [])[2]
    instance, zone, region = recovery.split("; ")
    assert "continue on another" in instance and "(run 7: 2 streams migrated, 0 requests lost, token RPO 0)" in instance
    assert "never drilled" in zone
    assert "end with the region" in region and "run 9: 0 streams migrated, 3 requests lost" in region


def test_how_long_is_the_runs_request_rto_and_rto_latency_where_measured() -> None:
    run = ran(5, "zone")
    run.report["measured"].update(request_rto_s=0.134, rto_latency_s=1.5)
    zone = triple.kv_texts([run], [])[2].split("; ")[1]
    assert "(run 5: 2 streams migrated, 0 requests lost, token RPO 0, request RTO 0.134 s, RTO_latency 1.5 s)" in zone


def test_an_instance_drill_that_lost_requests_does_not_promise_continuation() -> None:
    instance = triple.kv_texts([ran(4, "instance", lost=2)], [])[2].split("; ")[0]
    assert "run 4 lost requests in flight" in instance and "continue on another" not in instance


def test_a_failed_drill_is_named_and_its_figures_shown() -> None:
    zone = triple.kv_texts([ran(6, "zone", state="failed")], [])[2].split("; ")[1]
    assert "the last zone drill, run 6, failed" in zone


REFERENCE = {"engines": ["reference"], "sampling": "position_keyed"}
VLLM_WITH = {"engines": ["vllm"], "sampling": "position_keyed"}
VLLM_WITHOUT = {"engines": ["vllm"], "sampling": "engine_default"}


@pytest.mark.parametrize(("seen", "seeded", "verified"), [
    (REFERENCE, "token-identical on the same weights (the reference engine's position-keyed sampler; run 3)", True),
    (VLLM_WITH, "token-identical on the same weights (vLLM with Lifeline's logits processor lifeline_vllm loaded; "
                "run 3)", True),
    (VLLM_WITHOUT, f"{triple.SEEDED_WITHOUT_SAMPLER} (vLLM without Lifeline's logits processor lifeline_vllm: "
                   "one generator per request; run 3)", True),
    ({"engines": ["vllm"], "sampling": None},
     f"{triple.SEEDED_WITHOUT_SAMPLER} (an engine did not say how it samples; run 3)", False),
])
def test_continuations_follow_the_engine_kind_and_its_sampler(seen: dict[str, Any], seeded: str,
                                                               verified: bool) -> None:
    promise = triple.continuation(triple.engine_evidence([ran(3, "instance", seen=seen)]))
    assert promise.greedy == "token-identical on the same weights"
    assert (promise.seeded, promise.verified) == (seeded, verified)
    assert promise.sampled == "continues, may differ"


def test_without_a_recorded_engine_seeded_is_not_promised() -> None:
    promise = triple.continuation(triple.engine_evidence([ran(3, "instance")]))
    assert promise.verified is False and promise.seeded.startswith("ends not_resumable after a move")
    assert "lifeline_vllm" in promise.seeded


def test_the_newest_run_that_recorded_engines_decides() -> None:
    runs = [ran(8, "zone"), ran(7, "instance", seen=VLLM_WITHOUT), ran(2, "instance", seen=REFERENCE)]
    assert triple.engine_evidence(runs).model_dump() == {"engines": ["vllm"], "sampling": "engine_default",
                                                         "run_id": 7}


def test_each_policy_declares_its_rpo_context_per_session_class() -> None:
    policies = triple.declared_rpo_context([Policy("chat", "critical", 30, None, 2),
                                            Policy("batch", "rebuildable", 0),
                                            Policy("agent", "interactive", 120, 4)])
    assert [(p.session_class, p.declared) for p in policies] == [
        ("agent", "at most 120 s or 4 turns of context without a checkpoint at the standby (interactive)"),
        ("batch", "nothing replicated: the context is prefilled again at the standby (rebuildable)"),
        ("chat", "at most 30 s of context without a checkpoint at the standby (critical)"),
    ]
    kept = triple.kv_texts([], policies)[1]
    assert "chat: at most 30 s" in kept and "batch: nothing replicated" in kept


class FakeFleet:
    def __init__(self, kinds: dict[str, str]) -> None:
        self.kinds = kinds

    def instance_ids(self) -> list[str]:
        return sorted(self.kinds)

    def engine_of(self, instance_id: str) -> str:
        return self.kinds[instance_id]

    def engine_url(self, instance_id: str) -> str:
        return f"http://{instance_id}:8000"

    def served_model(self, instance_id: str) -> str:
        return "tiny"


def answering(by_host: dict[str, tuple[int, str] | None]) -> Any:
    def post(url: str, **_: Any) -> httpx.Response:
        answer = by_host[httpx.URL(url).host]
        if answer is None:
            raise httpx.ConnectError("refused")
        return httpx.Response(answer[0], text=answer[1])

    return post


def test_vllm_engines_are_asked_and_the_weakest_sampler_is_the_fleets() -> None:
    fleet = FakeFleet({"a": "vllm", "b": "vllm", "r": "reference"})
    refused = (400, f'{{"error": {{"message": "{SAMPLER_ID}"}}}}')
    seen = engines.evidence(fleet, fleet.instance_ids(), post=answering({"a": refused, "b": refused}))
    assert (seen["engines"], seen["sampling"]) == (["reference", "vllm"], "position_keyed")
    seen = engines.evidence(fleet, fleet.instance_ids(), post=answering({"a": refused, "b": (200, "{}")}))
    assert seen["sampling"] == "engine_default" and seen["instances"]["b"]["sampling"] == "engine_default"
    seen = engines.evidence(fleet, fleet.instance_ids(), post=answering({"a": refused, "b": None}))
    assert seen["sampling"] is None and seen["instances"]["b"]["sampling"] is None  # never assumed


def test_a_reference_engines_generation_is_read_and_vllms_is_unknown() -> None:
    fleet = FakeFleet({"r": "reference", "v": "vllm", "gone": "reference"})
    identity = {"instance_id": "r", "generation": 7, "boot_generation": 2, "model": "tiny", "weights_digest": "x",
                "zone": "a", "region": "local", "started_at": 0.0}

    def get(url: str, **_: Any) -> httpx.Response:
        host = httpx.URL(url).host
        if host == "gone":
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json=identity, request=httpx.Request("GET", url))

    assert engines.instance_generation(fleet, "r", get=get) == 7
    assert engines.instance_generation(fleet, "v", get=get) is None  # stock vLLM reports none
    assert engines.instance_generation(fleet, "gone", get=get) is None


def test_the_dns_ttls_come_from_the_drivers_file(tmp_path: Path) -> None:
    from controlplane.config import ControlPlaneSettings
    from controlplane.slo.service import dns_ttls

    secret = tmp_path / "tsig.secret"
    secret.write_text("c2VjcmV0")
    table = """
[dns]
zone = "lifeline.test."
name = "api.lifeline.test."
ttl_s = 45
{internal}
[dns.rfc2136]
server = "127.0.0.1"
key_name = "lifeline"
key_secret_file = "{secret}"
[dns.regions.eu]
answer = ["192.0.2.10"]
failover_to = "us"
[dns.regions.us]
answer = ["198.51.100.10"]
failover_to = "eu"
"""
    drivers = tmp_path / "drivers.toml"
    drivers.write_text(table.format(internal="", secret=secret))
    assert dns_ttls(ControlPlaneSettings(cutover_drivers_file=drivers)) == triple.DnsTtls(45, None)
    drivers.write_text(table.format(internal='internal_name = "internal.lifeline.test."', secret=secret))
    assert dns_ttls(ControlPlaneSettings(cutover_drivers_file=drivers)) == triple.DnsTtls(45, 600)
    assert dns_ttls(ControlPlaneSettings()) is None
