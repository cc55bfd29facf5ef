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
    return "\n".join(lines)


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
{% endfor %}</table>{% endif %}{% endfor %}</body></html>
""")


def to_html(document: SloDocument) -> str:
    return _HTML.render(d=document, value=_value)


def render(document: SloDocument, fmt: Format) -> str:
    return {"md": to_markdown, "json": to_json, "html": to_html}[fmt](document)
