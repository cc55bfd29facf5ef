"""The demo's summary when its output is not a terminal: one line per scenario, nothing wrapped."""

from __future__ import annotations

from lifeline.demo import report
from lifeline.demo.scenarios import Row


def test_the_plain_table_has_one_line_per_row_whatever_their_length() -> None:
    rows = [Row("engine kill", "eu-west-a's serving engine SIGKILLed mid-stream " * 3, detection_s=0.06,
                request_rto_s=0.71, token_rpo=0, requests_lost=0, tiers=["l7"], ok=True),
            Row("a | pipe", "x", ok=False)]
    lines = report.plain_table(rows).splitlines()
    assert len(lines) == 2 + len(rows)
    assert lines[0] == "| " + " | ".join(report.COLUMNS) + " |"
    assert lines[2].startswith("| engine kill | ") and lines[2].endswith("| yes |")
    assert "a \\| pipe" in lines[3] and lines[3].endswith("| NO |")
    assert report.plain_table(rows) in report.markdown(rows, header=["h"])
