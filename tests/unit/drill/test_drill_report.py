"""A drill report renders as Markdown ("measured vs target"), JSON and a real PNG timeline."""

from __future__ import annotations

import json

from controlplane.drill.report import export_report, to_markdown

REPORT = {
    "drill": "kill-one", "version": 2, "run": 7, "model": "tiny", "scope": "instance", "fault": "sigkill",
    "region": "local", "fault_target": "victim", "blast_radius": {"instances": ["victim"], "max_instances": 1},
    "requests": 2, "migrated_streams": 1, "error_rate": 0.0, "passed": False, "aborted": None,
    "verdicts": [{"metric": "request_rto_s", "target": 1.0, "measured": 1.5, "met": False},
                 {"metric": "token_rpo_tokens", "target": 0.0, "measured": 0.0, "met": True},
                 {"metric": "detection_s", "target": None, "measured": 0.01, "met": None}],
    "events": [{"id": 3, "kind": "instance.suppressed", "routing_tier": "l7", "actor": "gateway:gw",
                "scope": "region:local/instance:victim", "reason": "connection reset",
                "started_at": "2026-01-01T00:00:00+00:00", "outcome": "succeeded"}],
    "event_offsets": [[0.01, "l7 instance.suppressed"]],
    "follow_ups": ["request_rto_s: measured 1.500 vs target 1.000"],
    "timeline": [{"index": 0, "sampling": "greedy", "start": -0.2, "end": 1.6, "tokens": [-0.1, 0.0, 1.5],
                  "epochs": [0, 0, 1], "error": None},
                 {"index": 1, "sampling": "seeded", "start": 0.1, "end": 0.4, "tokens": [0.2, 0.3],
                  "epochs": [0, 0], "error": None}],
}


def test_markdown_states_measured_vs_target_and_follow_ups():
    text = to_markdown(REPORT)
    assert "run 7: FAILED" in text
    assert "| request_rto_s | 1.000 | 1.500 | **no** |" in text
    assert "| detection_s | — | 0.010 | not targeted |" in text
    assert "`l7` instance.suppressed by gateway:gw" in text
    assert "- request_rto_s: measured 1.500 vs target 1.000" in text


def test_export_writes_markdown_json_and_png(tmp_path):
    md, js, png = export_report(REPORT, tmp_path / "out")
    assert md.read_text() == to_markdown(REPORT)
    assert json.loads(js.read_text())["run"] == 7
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000


def test_markdown_names_the_faults_footprint_and_its_own_observations():
    zone = {**REPORT, "scope": "zone", "fault": "zone_loss", "fault_target": "local-a",
            "blast_radius": {"zones": ["local-a"], "instances": [], "max_instances": 2},
            "faulted_instances": ["a-0", "a-1"], "fault_cleared_at_s": 4.25, "requests_during_fault": 3,
            "refused_as_documented": 0, "fault_details": {"zone": "local-a", "instances_killed": ["a-0", "a-1"]}}
    text = to_markdown(zone)
    assert "zones ['local-a'], cap 2" in text
    assert "- faulted instances: ['a-0', 'a-1']" in text
    assert "- fault cleared 4.250 s after it landed; requests in flight or started during it: 3" in text
    assert '- instances_killed: ["a-0", "a-1"]' in text


def test_markdown_says_which_window_rto_latency_was_measured_over():
    text = to_markdown({**REPORT, "rto_latency_window": {"window_s": 3.0, "min_samples": 3, "target_s": 2.0,
                                                          "samples": 95}})
    assert ("TTFT p99 over a sliding 3.000 s window (at least 3 samples) stays within 2.000 s; 95 samples"
            in text)
    assert "sliding" not in to_markdown(REPORT)  # a report from before the window says nothing of it
