"""Pure recovery policy: may a failed stream move to another engine?

`decide()` reads only its arguments (a parametrized table test holds it); the
retry budget is checked after it, by the session, because it is shared state.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.settings import RecoveryStrategy
from gateway.stream_request import StreamRequest


def continuation_refused(request: StreamRequest) -> str | None:
    """Why a stream with committed tokens cannot be continued from them (a resume), or None if it can."""
    decision = decide(strategy=request.strategy, migrations=0, max_migrations=1, deadline_remaining=1.0,
                      min_deadline_remaining=0.0, committed=1, stateful=request.stateful)
    return None if decision.migrate or decision.reason != "not_resumable" else decision.message


@dataclass(frozen=True)
class Decision:
    migrate: bool
    reason: str = ""
    message: str = ""


def decide(
    *, strategy: RecoveryStrategy, migrations: int, max_migrations: int,
    deadline_remaining: float, min_deadline_remaining: float, committed: int = 0, stateful: bool = False,
) -> Decision:
    """The first rule that refuses names the typed error; otherwise migrate.

    Requests with several candidates (`n` > 1) never get here: they are refused with a 400 (`gateway/schemas.py`).
    """
    if strategy is RecoveryStrategy.FAIL_STOP:
        return Decision(False, "engine_failed", "the engine failed and the recovery strategy is fail_stop")
    if stateful and committed and strategy is RecoveryStrategy.TOKEN_COMMIT_RESUME:
        return Decision(False, "not_resumable", "the engine's grammar state for this request (response_format, guided "
                        "decoding) cannot be rebuilt from the committed tokens")
    if migrations >= max_migrations:
        return Decision(False, "migration_limit", f"the stream already migrated {migrations} times (limit {max_migrations})")
    if deadline_remaining < min_deadline_remaining:
        return Decision(False, "deadline_exceeded", f"{max(deadline_remaining, 0):.2f}s left before the deadline is too little to migrate")
    return Decision(True)
