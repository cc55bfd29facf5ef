"""Replication routes under /api/v1. Thin: parse, call the service, shape.

    PUT  /replication/policies                            set one policy (compare-and-set)   operator
    GET  /replication/policies[?model=]                   every policy                       viewer
    GET  /replication/policies/{model}/{session_class}    one policy                         viewer
    GET  /replication/status[?model=]                     lag, pending, dead letters          viewer
    GET  /replication/dead-letters[?model=&session_class=&include_cleared=]                   viewer
    POST /replication/dead-letters/retry                  copy again at the next sweep        operator
    POST /replication/dead-letters/clear                  stop reporting (sweeps skip it)     operator

Retry and clear take one policy's keys (or none: every `dead` letter), are all
or nothing, idempotent (a letter already in the target state is `unchanged`),
and write one event when they change something.

Store URLs are answered redacted: a password given in a Redis URL is never echoed.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from controlplane.auth.dependencies import Operator, Viewer
from controlplane.db import DbSession
from controlplane.deps import ClockDep, NamePath
from controlplane.replication import service
from controlplane.replication.states import DeadLetterAction
from controlplane.replication.schemas import (
    SESSION_CLASS_PATTERN,
    DeadLetterActionRead,
    DeadLetterSelection,
    PolicyDeadLetters,
    ReplicationPolicyRead,
    ReplicationPolicySpec,
    ReplicationStatusRead,
)

router = APIRouter(tags=["replication"])

ModelQuery = Annotated[str | None, Query(min_length=1, max_length=128, pattern=r"^[^\x00]*$")]
SessionClassPath = Annotated[str, Path(pattern=SESSION_CLASS_PATTERN, min_length=1, max_length=64)]
SessionClassQuery = Annotated[str | None, Query(pattern=SESSION_CLASS_PATTERN, min_length=1, max_length=64)]


@router.put("/replication/policies", response_model=ReplicationPolicyRead)
def put_policy(body: ReplicationPolicySpec, session: DbSession, principal: Operator, clock: ClockDep) -> Any:
    """Set the KV replication policy of one model and session class; one `replication.policy` event."""
    return service.put_policy(session, spec=body, actor=principal.actor, clock=clock)


@router.get("/replication/policies", response_model=list[ReplicationPolicyRead])
def list_policies(session: DbSession, _: Viewer, model: ModelQuery = None) -> Any:
    return service.list_policies(session, model=model)


@router.get("/replication/policies/{model}/{session_class}", response_model=ReplicationPolicyRead)
def get_policy(model: NamePath, session_class: SessionClassPath, session: DbSession, _: Viewer) -> Any:
    return service.get_policy_or_raise(session, model=model, session_class=session_class)


@router.get("/replication/status", response_model=ReplicationStatusRead)
def replication_status(session: DbSession, _: Viewer, clock: ClockDep, model: ModelQuery = None) -> Any:
    """Per policy: checkpoints pending, replication lag (computed now), totals and dead letters."""
    return service.status(session, clock=clock, model=model)


@router.get("/replication/dead-letters", response_model=list[PolicyDeadLetters])
def list_dead_letters(session: DbSession, _: Viewer, model: ModelQuery = None,
                      session_class: SessionClassQuery = None, include_cleared: bool = False) -> Any:
    """Per policy with any: its dead and retrying letters (and cleared ones with `include_cleared`)."""
    return service.list_dead_letters(session, model=model, session_class=session_class,
                                     include_cleared=include_cleared)


@router.post("/replication/dead-letters/retry", response_model=DeadLetterActionRead)
def retry_dead_letters(body: DeadLetterSelection, session: DbSession, principal: Operator, clock: ClockDep) -> Any:
    """Plan these checkpoints again at the next sweep, with the policy's attempts afresh."""
    return service.change_dead_letters(session, selection=body, action=DeadLetterAction.RETRY,
                                       actor=principal.actor, clock=clock)


@router.post("/replication/dead-letters/clear", response_model=DeadLetterActionRead)
def clear_dead_letters(body: DeadLetterSelection, session: DbSession, principal: Operator, clock: ClockDep) -> Any:
    """Stop reporting these dead letters; sweeps keep skipping their checkpoints (a retry undoes it)."""
    return service.change_dead_letters(session, selection=body, action=DeadLetterAction.CLEAR,
                                       actor=principal.actor, clock=clock)
