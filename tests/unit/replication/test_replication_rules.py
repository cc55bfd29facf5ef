"""The pure rules of replication: which policies a sweep replicates, and the lag the status reports."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from controlplane.replication.schemas import ReplicationPolicySpec
from controlplane.replication.service import is_due, lag_seconds

NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize("mode, every_seconds, last_sweep_ago, due", [
    ("rebuildable", None, None, False),
    ("rebuildable", None, 3600, False),
    ("critical", None, None, True),
    ("critical", None, 0, True),
    ("interactive", 60, None, True),
    ("interactive", 60, 59, False),
    ("interactive", 60, 60, True),
    ("interactive", None, 1, True),  # every N turns only: replicated at every sweep
])
def test_which_policies_a_sweep_replicates(mode, every_seconds, last_sweep_ago, due):
    last = None if last_sweep_ago is None else NOW - timedelta(seconds=last_sweep_ago)
    assert is_due(mode=mode, every_seconds=every_seconds, last_sweep_at=last, now=NOW) is due


@pytest.mark.parametrize("mode, pending, last_sweep_ago, due", [
    ("critical", 3, 10, False),  # the last sweep's copies are still queued: not again
    ("critical", 3, 120, True),  # …unless that sweep is older than replan_after
    ("critical", 0, 0, True),
    ("interactive", 3, 10, False),
    ("rebuildable", 0, 10**6, False),
])
def test_a_sweep_does_not_queue_pending_copies_twice(mode, pending, last_sweep_ago, due):
    assert is_due(mode=mode, every_seconds=5, last_sweep_at=NOW - timedelta(seconds=last_sweep_ago), now=NOW,
                  pending=pending, replan_after=timedelta(minutes=2)) is due


@pytest.mark.parametrize("pending, oldest, last, now, lag", [
    (0, None, None, 100.0, None),
    (0, None, 2.5, 100.0, 2.5),
    (3, 90.0, 2.5, 100.0, 10.0),  # pending: the oldest has waited 10 s, whatever the last copy took
    (3, None, 2.5, 100.0, 2.5),  # pending but undated
    (1, 101.0, None, 100.0, 0.0),  # a source clock ahead of ours never gives a negative lag
])
def test_lag_is_the_oldest_pending_wait_else_the_last_copys(pending, oldest, last, now, lag):
    assert lag_seconds(pending=pending, oldest_pending_created_at=oldest, last_lag_seconds=last, now=now) == lag


def test_a_password_in_a_refused_store_url_is_not_in_the_error():
    with pytest.raises(ValidationError) as refused:
        ReplicationPolicySpec(model="m", session_class="c", mode="critical", rpo_context_seconds=1, reason="r",
                              source_store="/kv/a", destination_store="ftp://u:s3cret@host/kv")
    assert "s3cret" not in str(refused.value.errors(include_input=False))
