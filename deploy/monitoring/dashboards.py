"""Grafana dashboards for Lifeline, written from code with Grafana's own Foundation SDK.

    .venv/bin/python deploy/monitoring/dashboards.py          write deploy/monitoring/controlplane/dashboards/*.json
    .venv/bin/python deploy/monitoring/dashboards.py --check  exit 1 if a written one differs

One dashboard per question an SRE asks at 3 a.m., every panel a query over
metrics the code exports (or the recording rules of lifeline-rules.yaml):

    lifeline-fleet        where is capacity: gateways, streams in flight, leases, the pool by zone and state
    lifeline-streams      are streams surviving: outcomes, migrations by reason, the recovery gap, TTFT
    lifeline-canaries     is the output right: canary and health verdicts, wrong answers per instance
    lifeline-replication  is session context replicated in time: lag against the declared RPO_context
    lifeline-cutovers     what moved and why: the escalation ladder's decisions per tier on a timeline,
                          the stop switch, drill runs and their figures

Dashboard uids and panel ids are fixed, so a link to one panel
(`/d/<uid>?viewPanel=<id>`, what the console links to) stays valid across
versions. Panels read a `datasource` variable (any Prometheus) and filter by
the `region` label the ServiceMonitors put on every series.
tests/integration/deploy/test_monitoring_dashboards.py holds the written
files equal to this output, checks every query with promtool, and every
metric a query reads against the code.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos

HERE = Path(__file__).resolve().parent
OUT = HERE / "controlplane" / "dashboards"  # inside the kustomization that ships them (kustomize reads no file above it)
REGION = 'region=~"$region"'
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass(frozen=True)
class Panel:
    id: int
    title: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""
    bars: bool = False  # discrete events (decisions, runs) drawn as bars on the timeline


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]


BOARDS = (
    Board("lifeline-fleet", "Lifeline: fleet by region and zone",
          "Where the serving capacity is: gateways, streams in flight, the leases the agents hold, the warm pool.", (
              Panel(1, "Gateways answering", ((f"count by (region) (lifeline_gateway_active_requests{{{REGION}}})",
                                               "{{region}}"),),
                    description="Gateway replicas whose /metrics answered, per region."),
              Panel(2, "Streams in flight", ((f"sum by (region) (lifeline_gateway_active_requests{{{REGION}}})",
                                              "{{region}}"),)),
              Panel(3, "Leases the agent holds", ((f"sum by (region) (lifeline_agent_leases_held{{{REGION}}})",
                                                   "{{region}}"),)),
              Panel(4, "Warm pool by zone and state",
                    ((f"sum by (region, zone, state) (lifeline_agent_pool_instances{{{REGION}}})",
                      "{{region}}/{{zone}} {{state}}"),),
                    description="serving, warm, cold, draining: a zone with cold and no warm has no reserve."),
              Panel(5, "Endpoints the agent's verdicts take out",
                    ((f"max by (region, action) (lifeline_gateway_agent_verdicts{{{REGION}}})",
                      "{{region}} {{action}}"),)),
          )),
    Board("lifeline-streams", "Lifeline: streams and migrations",
          "Are streams surviving their engines: outcomes, migrations by reason, the gap the client saw.", (
              Panel(1, "Requests by outcome", ((
                  f"sum by (region, outcome) (rate(lifeline_gateway_requests_total{{{REGION}}}[5m]))",
                  "{{region}} {{outcome}}"),), unit="reqps"),
              Panel(2, "Migrations by reason", ((
                  f"sum by (region, reason) (rate(lifeline_gateway_migrations_total{{{REGION}}}[5m]))",
                  "{{region}} {{reason}}"),), unit="ops"),
              Panel(3, "Recovery gap (failure → next token)", (
                  (f"histogram_quantile(0.5, sum by (le, region) (rate(lifeline_gateway_recovery_gap_seconds_bucket"
                   f"{{{REGION}}}[5m])))", "p50 {{region}}"),
                  (f"histogram_quantile(0.99, sum by (le, region) (rate(lifeline_gateway_recovery_gap_seconds_bucket"
                   f"{{{REGION}}}[5m])))", "p99 {{region}}")), unit="s",
                    description="The request RTO as the gateways see it."),
              Panel(4, "Time to first token p99", ((
                  f"histogram_quantile(0.99, sum by (le, region) (rate("
                  f"lifeline_gateway_time_to_first_token_seconds_bucket{{{REGION}}}[5m])))", "{{region}}"),), unit="s"),
              Panel(5, "Streams ended with a typed error", ((
                  f"sum by (region, type) (rate(lifeline_gateway_recovery_failures_total{{{REGION}}}[5m]))",
                  "{{region}} {{type}}"),), unit="ops",
                    description="retry_budget_exhausted, no_healthy_endpoint, not_resumable, …"),
              Panel(6, "Refused by admission", ((
                  f"sum by (region, type) (rate(lifeline_gateway_admission_rejected_total{{{REGION}}}[5m]))",
                  "{{region}} {{type}}"),), unit="reqps"),
          )),
    Board("lifeline-canaries", "Lifeline: canary verdicts",
          "Is the output right: the agents' canaries against the catalog's recorded tokens, and health probes.", (
              Panel(1, "Canaries by verdict", ((
                  f"sum by (region, verdict) (rate(lifeline_agent_inference_probes_total{{{REGION}}}[5m]))",
                  "{{region}} {{verdict}}"),), unit="ops"),
              Panel(2, "Wrong answers per instance", ((
                  f"max by (region, instance) (lifeline_agent_instance_wrong_outputs{{{REGION}}})",
                  "{{region}} {{instance}}"),)),
              Panel(3, "Health probes by verdict", ((
                  f"sum by (region, verdict) (rate(lifeline_agent_probes_total{{{REGION}}}[5m]))",
                  "{{region}} {{verdict}}"),), unit="ops"),
              Panel(4, "Canary rate against its budget", (
                  (f"sum by (region) (lifeline_agent_inference_probe_rate_per_second{{{REGION}}})", "sent {{region}}"),
                  (f"sum by (region) (lifeline_agent_inference_probe_budget_per_second{{{REGION}}})",
                   "budget {{region}}")), unit="ops"),
          )),
    Board("lifeline-replication", "Lifeline: KV replication against RPO_context",
          "Is session context at the standby in time: lag per policy against the RPO_context it declares.", (
              Panel(1, "Lag / declared RPO_context", ((
                  "max by (model, session_class) (lifeline_controlplane_replication_lag_rpo_ratio)",
                  "{{model}} {{session_class}}"),), unit="percentunit",
                    description="Above 1 the policy misses its declared RPO_context."),
              Panel(2, "Lag and RPO_context (seconds)", (
                  ("max by (model, session_class) (lifeline_controlplane_replication_lag_seconds)",
                   "lag {{model}} {{session_class}}"),
                  ("max by (model, session_class) (lifeline_controlplane_replication_rpo_context_seconds)",
                   "RPO_context {{model}} {{session_class}}")), unit="s"),
              Panel(3, "Checkpoints not yet at the standby", ((
                  "sum by (model, session_class) (lifeline_controlplane_replication_pending_checkpoints)",
                  "{{model}} {{session_class}}"),)),
              Panel(4, "Dead letters", ((
                  "sum by (state) (lifeline_controlplane_replication_dead_letters)", "{{state}}"),)),
          )),
    Board("lifeline-cutovers", "Lifeline: cutovers and drills",
          "What moved, at which tier, and why: the escalation ladder on a timeline, the stop switch, drills.", (
              Panel(1, "Escalation decisions by tier", ((
                  "sum by (tier, action) (increase(lifeline_cutover_escalation_decisions_total[1m]))",
                  "{{tier}} {{action}}"),), bars=True,
                    description="Each bar a minute's decisions: cut_over at which tier, skipped, held, contained."),
              Panel(2, "Stop switch writes", ((
                  "sum by (to) (increase(lifeline_cutover_gate_changes_total[1m]))", "{{to}}"),), bars=True),
              Panel(3, "Drill runs by outcome", ((
                  "sum by (scope, fault, outcome) (increase(lifeline_drill_runs_total[5m]))",
                  "{{scope}} {{fault}} {{outcome}}"),), bars=True),
              Panel(4, "Drill figures (latest run)", ((
                  'max by (drill, metric) (lifeline_drill_last_measured{metric=~".*_s"})', "{{drill}} {{metric}}"),),
                    unit="s"),
          )),
)


def _panel(panel: Panel, index: int) -> timeseries.Panel:
    built = (timeseries.Panel().id(panel.id).title(panel.title).unit(panel.unit).datasource(DATASOURCE)
             .grid_pos(GridPos(h=8, w=12, x=12 * (index % 2), y=8 * (index // 2))))
    if panel.description:
        built = built.description(panel.description)
    if panel.bars:
        from grafana_foundation_sdk.models.common import GraphDrawStyle

        built = built.draw_style(GraphDrawStyle.BARS).fill_opacity(80)
    for ref, (expr, legend) in zip("ABCDEFGH", panel.queries, strict=False):
        built = built.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
                                  .datasource(DATASOURCE))
    return built


def build(board: Board) -> dict:
    """The dashboard's JSON model."""
    built = (dashboard.Dashboard(board.title).uid(board.uid).description(board.description)
             .tags(["lifeline"]).refresh("30s").time("now-6h", "now").timezone("utc")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
             .with_variable(dashboard.QueryVariable("region").label("Region").datasource(DATASOURCE)
                            .query("label_values(lifeline_gateway_active_requests, region)")
                            .multi(True).include_all(True).all_value(".*")))
    for index, panel in enumerate(board.panels):
        built = built.with_panel(_panel(panel, index))
    return json.loads(json.dumps(built.build(), cls=JSONEncoder, sort_keys=True))


def render(board: Board) -> str:
    return json.dumps(build(board), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    OUT.mkdir(exist_ok=True)
    for board in BOARDS:
        path = OUT / f"{board.uid}.json"
        text = render(board)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
    if stale:
        print("stale, run deploy/monitoring/dashboards.py: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
