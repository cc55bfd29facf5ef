"""Render an SLO document as Markdown, JSON or HTML. Generated, never edited by hand."""

from __future__ import annotations

from typing import Literal

from jinja2 import Environment, select_autoescape

from controlplane.slo.schemas import SloDocument, SloFigure

Format = Literal["md", "json", "html"]
MEDIA_TYPES = {"md": "text/markdown; charset=utf-8", "json": "application/json", "html": "text/html; charset=utf-8"}


def _value(figure: SloFigure, value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:g} {figure.unit}"


def _measured(figure: SloFigure) -> str:
    if figure.status == "unverified":
        return f"*unverified* ({figure.why})"
    if figure.source == "reports":
        return f"{_value(figure, figure.measured)} ({figure.why})"
    return f"{_value(figure, figure.measured)} (run {figure.run_id}, {figure.drill})"


def to_markdown(document: SloDocument) -> str:
    lines = [f"# SLO: {document.model}", "", f"_{document.note}_", "",
             f"Generated {document.generated_at.isoformat()}.", ""]
    if document.catalog.versions or document.catalog.aliases:
        aliases = ", ".join(f"`{a}` → `{v}`" for a, v in sorted(document.catalog.aliases.items())) or "none"
        versions = ", ".join(f"`{v}`" for v in document.catalog.versions) or "none"
        lines += [f"Versions: {versions}; aliases: {aliases}.", ""]
    for entry in document.triple:
        lines += [f"## {entry.dimension}: {entry.name}", "", f"- lost: {entry.lost}", f"- kept: {entry.kept}",
                  f"- recovery: {entry.recovery}", ""]
        if entry.figures:
            lines += ["| target | objective | latest measured |", "|---|---|---|"]
            lines += [f"| {f.label} | {_value(f, f.target)} | {_measured(f)} |" for f in entry.figures]
            lines.append("")
    lines += ["## Continuations after a migration", "", f"Engines: {_engines(document)}.", "",
              "| decoding | continuation |", "|---|---|",
              f"| greedy | {document.continuation.greedy} |", f"| seeded | {document.continuation.seeded} |",
              f"| other sampling | {document.continuation.sampled} |", "",
              "## RPO_context declared per session class", ""]
    if document.rpo_context_policies:
        lines += ["| session class | mode | declared RPO_context | policy revision |", "|---|---|---|---|"]
        lines += [f"| {p.session_class} | {p.mode} | {p.declared} | {p.revision} |"
                  for p in document.rpo_context_policies]
    else:
        lines.append("No replication policy: a region loss costs every session its context (prefilled again).")
    lines.append("")
    return "\n".join(lines)


def _engines(document: SloDocument) -> str:
    engine = document.engine
    if engine.run_id is None:
        return "not recorded by any drill run (unverified)"
    return f"{', '.join(engine.engines)}, sampling {engine.sampling or 'unknown'} (drill run {engine.run_id})"


def to_json(document: SloDocument) -> str:
    return document.model_dump_json(indent=2)


_HTML = Environment(autoescape=select_autoescape(default=True)).from_string("""<!doctype html>
<html><head><meta charset="utf-8"><title>SLO: {{ d.model }}</title></head>
<body><h1>SLO: {{ d.model }}</h1><p><em>{{ d.note }}</em></p><p>Generated {{ d.generated_at.isoformat() }}.</p>
{% for e in d.triple %}<h2>{{ e.dimension }}: {{ e.name }}</h2>
<ul><li>lost: {{ e.lost }}</li><li>kept: {{ e.kept }}</li><li>recovery: {{ e.recovery }}</li></ul>
{% if e.figures %}<table><tr><th>target</th><th>objective</th><th>latest measured</th></tr>
{% for f in e.figures %}<tr class="{{ f.status }}"><td>{{ f.label }}</td><td>{{ value(f, f.target) }}</td>
<td>{% if f.status == "unverified" %}<em>unverified</em> ({{ f.why }})
{%- elif f.source == "reports" %}{{ value(f, f.measured) }} ({{ f.why }})
{%- else %}{{ value(f, f.measured) }}
(run {{ f.run_id }}, {{ f.drill }}){% endif %}</td></tr>
{% endfor %}</table>{% endif %}{% endfor %}
<h2>Continuations after a migration</h2><p>Engines: {{ engines }}.</p>
<table><tr><th>decoding</th><th>continuation</th></tr>
<tr><td>greedy</td><td>{{ d.continuation.greedy }}</td></tr><tr><td>seeded</td><td>{{ d.continuation.seeded }}</td></tr>
<tr><td>other sampling</td><td>{{ d.continuation.sampled }}</td></tr></table>
<h2>RPO_context declared per session class</h2>
{% if d.rpo_context_policies %}<table><tr><th>session class</th><th>mode</th><th>declared RPO_context</th>
<th>policy revision</th></tr>{% for p in d.rpo_context_policies %}<tr><td>{{ p.session_class }}</td><td>{{ p.mode }}</td>
<td>{{ p.declared }}</td><td>{{ p.revision }}</td></tr>{% endfor %}</table>
{% else %}<p>No replication policy: a region loss costs every session its context (prefilled again).</p>{% endif %}
</body></html>
""")


def to_html(document: SloDocument) -> str:
    return _HTML.render(d=document, value=_value, engines=_engines(document))


def render(document: SloDocument, fmt: Format) -> str:
    return {"md": to_markdown, "json": to_json, "html": to_html}[fmt](document)
