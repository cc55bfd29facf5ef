"""The demo's report directory: the scenario table (Markdown), the events (JSON lines), a timeline, the SLO document.

Everything written here was measured in the run that writes it; a figure
that could not be measured is `n/a`, never a default. The timeline plots
the steady traffic's completed requests per second per region, each
recovery gap a pinned stream saw, and every `routing_tier` event.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from lifeline.demo.scenarios import Row, Traffic, count, fmt

COLUMNS = ["scenario", "what failed", "detection", "RTO_latency", "request RTO", "token RPO", "RPO_context",
           "requests lost", "routing.tier events, in order", "promise kept"]


def row_cells(row: Row) -> list[str]:
    return [row.scenario, row.failed, fmt(row.detection_s), fmt(row.rto_latency_s), fmt(row.request_rto_s),
            count(row.token_rpo), "n/a" if row.rpo_context is None else f"{row.rpo_context} tok",
            count(row.requests_lost), ", ".join(row.tiers) or "—", "yes" if row.ok else "NO"]


def plain_table(rows: list[Row]) -> str:
    """The summary as a Markdown table, one line per row: what the demo prints when its output is not a terminal
    (a file, a pipe, CI), where a boxed table is cut to 80 columns and every cell wraps."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def markdown(rows: list[Row], *, header: list[str]) -> str:
    lines = ["# Lifeline demo report", "", *header, "", plain_table(rows)]
    lines += ["", "## What each scenario showed", ""]
    lines += [f"- **{row.scenario}**: {_plain(row.line)}" for row in rows]
    notes = [f"- {row.note}" for row in rows if row.note]
    if notes:
        lines += ["", "## Seen exceeded in this run (another component's promise)", "", *notes]
    return "\n".join(lines) + "\n"


def _plain(text: str) -> str:
    for tag in ("[green]", "[red]", "[/]", "[bold]"):
        text = text.replace(tag, "")
    return text


def write(directory: Path, *, rows: list[Row], header: list[str], events: list[dict[str, Any]],
          traffic: list[Traffic], began: float, slo: dict[str, str]) -> list[Path]:
    """Write the report files; their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / "demo.md", directory / "events.jsonl", directory / "timeline.png"]
    written[0].write_text(markdown(rows, header=header))
    written[1].write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in events))
    timeline(written[2], rows=rows, events=events, traffic=traffic, began=began)
    for suffix, body in slo.items():
        path = directory / f"slo.{suffix}"
        path.write_text(body)
        written.append(path)
    (directory / "scenarios.json").write_text(json.dumps(
        [{"scenario": r.scenario, "failed": r.failed, "detection_s": r.detection_s, "rto_latency_s": r.rto_latency_s,
          "request_rto_s": r.request_rto_s, "token_rpo": r.token_rpo, "rpo_context": r.rpo_context,
          "requests_lost": r.requests_lost, "routing_tier_events": r.tiers, "ok": r.ok} for r in rows], indent=2))
    written.append(directory / "scenarios.json")
    return written


def timeline(path: Path, *, rows: list[Row], events: list[dict[str, Any]], traffic: list[Traffic],
             began: float) -> None:
    """Requests/s per region (completed steady streams, 1 s bins), the scenarios' fault marks, the tier events."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6), sharex=True, height_ratios=[3, 1])
    for flow in traffic:
        ends = sorted(r.ended - began for r in flow.runs if r.error is None)
        if ends:
            bins = range(int(ends[-1]) + 2)
            top.hist(ends, bins=list(bins), histtype="step", label=f"{flow.region}: requests/s completed")
        failed = [r.ended - began for r in flow.runs if r.error is not None]
        if failed:
            top.plot(failed, [0] * len(failed), "rx", label=f"{flow.region}: requests lost")
    gap_label = "recovery gap of the pinned stream (request RTO)"
    for row in rows:
        top.axvspan(row.fault_at - began, row.ended_at - began, alpha=0.12)
        top.text(row.fault_at - began, top.get_ylim()[1] * 0.95, row.scenario, fontsize=7, rotation=90, va="top")
        if row.request_rto_s:
            top.plot([row.fault_at - began, row.fault_at - began + row.request_rto_s], [0.2, 0.2], lw=4,
                     color="black", label=gap_label)
            gap_label = None
    starts = [r.started - began for flow in traffic for r in flow.runs]
    if starts:
        top.set_xlim(left=max(0.0, min(starts) - 2))
    top.set_ylabel("requests/s")
    top.legend(fontsize=7, loc="upper right")
    tiers = ["l7", "mesh", "anycast", "dns"]
    wall_zero = _wall_zero(rows, events, began)
    for event in events:
        if event.get("routing_tier") in tiers and wall_zero is not None:
            at = datetime.fromisoformat(str(event["started_at"]).replace("Z", "+00:00")).timestamp() - wall_zero
            bottom.plot([at], [tiers.index(event["routing_tier"])], "|", ms=12)
    bottom.set_yticks(range(len(tiers)), tiers)
    bottom.set_xlabel("seconds since the demo began")
    bottom.set_title("routing.tier events", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _wall_zero(rows: list[Row], events: list[dict[str, Any]], began: float) -> float | None:
    """The wall-clock time of `began` (the events carry wall time, the rows monotonic)."""
    import time

    return time.time() - (time.monotonic() - began)
