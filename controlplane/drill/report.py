"""A drill run's report as files: Markdown ("RTO measured vs target"), JSON, and a timeline PNG.

The report dict is what the run row stores; these are renderings of it,
never edited by hand. The plot uses matplotlib's Agg backend (no display):
one line per request, a dot per token, coloured by request epoch (0 = the
first engine, 1 = after migration), the fault at t = 0 and each routing
event as a labelled vertical line.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def to_markdown(report: dict[str, Any]) -> str:
    verdict = "ABORTED" if report.get("aborted") else ("PASSED" if report.get("passed") else "FAILED")
    lines = [
        f"# Drill {report['drill']} v{report['version']}, run {report['run']}: {verdict}",
        "",
        (f"- model: `{report['model']}`; scope: {report['scope']}; fault: {report['fault']} on "
         f"`{report.get('fault_target')}` (region {report['region']})"),
        (f"- blast radius: instances {report['blast_radius'].get('instances')}, zones "
         f"{report['blast_radius'].get('zones') or []}, cap {report['blast_radius'].get('max_instances')}"),
        (f"- requests: {report.get('requests')}; migrated streams: {report.get('migrated_streams')}; "
         f"error rate: {_fmt(report.get('error_rate'))}"),
    ]
    if report.get("faulted_instances"):
        lines.append(f"- faulted instances: {report['faulted_instances']}")
    if "fault_cleared_at_s" in report:
        lines.append(f"- fault cleared {_fmt(report['fault_cleared_at_s'])} s after it landed; requests in flight or "
                     f"started during it: {report.get('requests_during_fault')}; refused as documented: "
                     f"{report.get('refused_as_documented', 0)}")
    window = report.get("rto_latency_window")
    if window:
        lines.append(f"- RTO_latency: the first time from which TTFT p99 over a sliding {_fmt(window['window_s'])} s "
                     f"window (at least {window['min_samples']} samples) stays within {_fmt(window['target_s'])} s; "
                     f"{window['samples']} samples")
    for key, value in (report.get("fault_details") or {}).items():
        lines.append(f"- {key}: {json.dumps(value, sort_keys=True, default=str)}")
    lines += [
        "",
        "## RTO measured vs target",
        "",
        "| metric | target | measured | met |",
        "|---|---|---|---|",
    ]
    for v in report.get("verdicts", []):
        met = {True: "yes", False: "**no**", None: "not targeted"}[v["met"]]
        lines.append(f"| {v['metric']} | {_fmt(v['target'])} | {_fmt(v['measured'])} | {met} |")
    lines += ["", "## routing.tier events, in order", ""]
    routing = [e for e in report.get("events", []) if e.get("routing_tier")]
    if not routing:
        lines.append("none")
    for e in routing:
        lines.append(f"- `{e['routing_tier']}` {e['kind']} by {e['actor']} on {e['scope']}: {e['reason']} "
                     f"({e['started_at']})")
    lines += ["", "## Follow-up items", ""]
    lines += [f"- {item}" for item in report.get("follow_ups", [])] or ["none"]
    return "\n".join(lines) + "\n"


def plot_timeline(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 1.5 + 0.3 * max(1, len(report.get("timeline", [])))))
    try:
        for row in report.get("timeline", []):
            y = row["index"]
            end = row["end"] if row["end"] is not None else (row["tokens"][-1] if row["tokens"] else row["start"])
            axes.hlines(y, row["start"], end, colors="lightgray", linewidth=1)
            colors = ["tab:blue" if epoch == 0 else "tab:orange" for epoch in row["epochs"]]
            axes.scatter(row["tokens"], [y] * len(row["tokens"]), c=colors, s=6)
            if row.get("error"):
                axes.scatter([end], [y], marker="x", c="tab:red")
        axes.axvline(0.0, color="tab:red", linestyle="--", label=f"fault: {report['fault']}")
        if report.get("fault_cleared_at_s"):
            axes.axvline(report["fault_cleared_at_s"], color="tab:purple", linestyle="--", label="fault cleared")
        for offset, label in report.get("event_offsets", []):
            axes.axvline(offset, color="tab:green", linestyle=":", linewidth=1)
            axes.annotate(label, (offset, 0), fontsize="x-small", rotation=90, va="bottom")
        from matplotlib.ticker import MaxNLocator

        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_xlabel("seconds since the fault (blue: first engine, orange: after migration)")
        axes.set_ylabel("request")
        axes.set_title(f"{report['drill']} v{report['version']} run {report['run']}")
        axes.legend(loc="upper right", fontsize="small")
        figure.tight_layout()
        figure.savefig(path, format="png", dpi=100)
    finally:
        plt.close(figure)
    return path


def export_report(report: dict[str, Any], directory: Path | str) -> list[Path]:
    """Write `run-<id>.md`, `run-<id>.json` and `run-<id>-timeline.png` into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{report['drill']}-run-{report['run']}"
    md = directory / f"{stem}.md"
    md.write_text(to_markdown(report))
    js = directory / f"{stem}.json"
    js.write_text(json.dumps(report, indent=2, sort_keys=True, default=_json_default))
    png = plot_timeline(report, directory / f"{stem}-timeline.png")
    return [md, js, png]


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
