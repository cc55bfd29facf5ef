"""Replace one `## …` section of docs/benchmarks.md, leaving every other section alone."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, heading: str, body: str) -> None:
    lines = path.read_text().splitlines() if path.exists() else ["# Benchmarks", ""]
    try:
        start = lines.index(heading)
    except ValueError:
        new = [*lines, "", heading, "", body.rstrip(), ""]
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        new = [*lines[:start], heading, "", body.rstrip(), "", *lines[end:]]
    path.write_text("\n".join(new).rstrip() + "\n")
