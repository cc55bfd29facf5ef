"""`lifeline replication policy set|list|show`, `dead-letters list|retry|clear`, `worker|beat|status`.

Policy commands use the database through the service layer, audited as
`cli:<user>`, and write the same events as the API. `worker` and `beat` run
Celery's own worker and beat on `controlplane.celery_app` (the broker is
`LIFELINE_CONTROLPLANE_CELERY_BROKER_URL`). Mounted by lifeline/cli.py.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer

from controlplane.cli_support import audited_command, cli_actor, load_settings, read_only, run_mutation

replication_app = typer.Typer(no_args_is_help=True, add_completion=False,
                              help="KV checkpoint replication: policies, Celery worker and beat, status.")
policy_app = typer.Typer(no_args_is_help=True, add_completion=False,
                         help="Replication policies per model and session class.")
replication_app.add_typer(policy_app, name="policy")
dead_letters_app = typer.Typer(no_args_is_help=True, add_completion=False,
                               help="Checkpoints a worker gave up on: list, retry, clear.")
replication_app.add_typer(dead_letters_app, name="dead-letters")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a summary.")]


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def _policy_json(policy: Any) -> dict[str, Any]:
    from controlplane.replication.schemas import ReplicationPolicyRead

    return ReplicationPolicyRead.model_validate(policy).model_dump(mode="json")


def _line(row: dict[str, Any]) -> str:
    every = ""
    if row["mode"] == "interactive":
        every = " every " + " or ".join(p for p in (f"{row['every_turns']} turns" if row["every_turns"] else "",
                                                    f"{row['every_seconds']}s" if row["every_seconds"] else "") if p)
    stores = f" {row['source_store']} -> {row['destination_store']}" if row["source_store"] else ""
    return (f"{row['model']}/{row['session_class']} r{row['revision']}: {row['mode']}{every}, "
            f"RPO_context {row['rpo_context_seconds']}s, retention {row['retention_seconds']}s{stores}")


@policy_app.command("set")
def policy_set(
    model: str,
    session_class: str,
    mode: Annotated[str, typer.Option(help="rebuildable | interactive | critical")],
    rpo_context_seconds: Annotated[int, typer.Option("--rpo-context-seconds", help="Declared RPO_context.")],
    reason: Annotated[str, typer.Option(help="Why, for the event log.")],
    source: Annotated[str | None, typer.Option(help="The primary region's KV store URL.")] = None,
    destination: Annotated[str | None, typer.Option(help="The standby region's KV store URL.")] = None,
    every_turns: Annotated[int | None, typer.Option(help="interactive: every N turns.")] = None,
    every_seconds: Annotated[int | None, typer.Option(help="interactive: every T seconds.")] = None,
    rpo_context_turns: Annotated[int | None, typer.Option(help="Declared RPO_context in turns.")] = None,
    retention_seconds: Annotated[int, typer.Option(help="Delete destination checkpoints older than this.")] = 86400,
    max_attempts: Annotated[int, typer.Option(help="Copies tried before a dead letter.")] = 5,
    expected_revision: Annotated[int | None, typer.Option(help="Compare-and-set; 0: must be new.")] = None,
) -> None:
    """Create or replace a policy (one replication.policy event), as PUT /api/v1/replication/policies."""
    from pydantic import ValidationError

    from controlplane.replication import service
    from controlplane.replication.schemas import ReplicationPolicySpec

    settings = load_settings()
    action, target = "replication.policy.set", f"replication:{model}/{session_class}"
    with audited_command(settings, action=action, target=target):  # a refused argument is audited too
        try:
            spec = ReplicationPolicySpec(
                model=model, session_class=session_class, mode=mode, every_turns=every_turns,
                every_seconds=every_seconds, rpo_context_seconds=rpo_context_seconds,
                rpo_context_turns=rpo_context_turns, source_store=source, destination_store=destination,
                retention_seconds=retention_seconds, max_attempts=max_attempts, reason=reason,
                expected_revision=expected_revision)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'policy'}: {e['msg']}"
                                 for e in exc.errors(include_url=False))
            typer.echo(f"error: invalid_request: {problems}", err=True)
            raise typer.Exit(2) from None
    row = run_mutation(settings, action=action, target=target, work=lambda session, clock: _policy_json(
        service.put_policy(session, spec=spec, actor=cli_actor(), clock=clock)))
    typer.echo(_line(row))


@policy_app.command("list")
def policy_list(model: Annotated[str | None, typer.Option()] = None, as_json: JsonFlag = False) -> None:
    """Every policy: model/session class, revision, mode, RPO_context, retention, stores (redacted)."""
    from controlplane.replication import service

    rows = read_only(load_settings(), lambda session: [_policy_json(p)
                                                       for p in service.list_policies(session, model=model)])
    if as_json:
        _print_json(rows)
        return
    for row in rows:
        typer.echo(_line(row))


@policy_app.command("show")
def policy_show(model: str, session_class: str) -> None:
    """One policy (JSON)."""
    from controlplane.replication import service

    _print_json(read_only(load_settings(), lambda session: _policy_json(
        service.get_policy_or_raise(session, model=model, session_class=session_class))))


@dead_letters_app.command("list")
def dead_letters_list(
    model: Annotated[str | None, typer.Option()] = None,
    session_class: Annotated[str | None, typer.Option("--session-class")] = None,
    include_cleared: Annotated[bool, typer.Option("--include-cleared", help="Cleared ones too.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Dead and retrying letters per policy, as GET /api/v1/replication/dead-letters."""
    from controlplane.replication import service

    rows = read_only(load_settings(), lambda session: [r.model_dump(mode="json") for r in service.list_dead_letters(
        session, model=model, session_class=session_class, include_cleared=include_cleared)])
    if as_json:
        _print_json(rows)
        return
    for row in rows:
        for letter in row["dead_letters"]:
            typer.echo(f"{row['model']}/{row['session_class']} {letter['state']} {letter['checkpoint_key']} "
                       f"after {letter['attempts']}: {letter['error']}")


def _change_dead_letters(action: str, model: str, session_class: str, keys: list[str] | None, every: bool,
                         reason: str) -> None:
    from pydantic import ValidationError

    from controlplane.replication import service
    from controlplane.replication.schemas import DeadLetterSelection
    from controlplane.replication.states import DeadLetterAction

    settings = load_settings()
    audit_action, target = f"replication.dead_letters.{action}", f"replication:{model}/{session_class}"
    with audited_command(settings, action=audit_action, target=target):  # a refused argument is audited too
        if bool(keys) == every:
            typer.echo("error: invalid_request: name checkpoint keys or --all (every dead letter), not both",
                       err=True)
            raise typer.Exit(2)
        try:
            selection = DeadLetterSelection(model=model, session_class=session_class,
                                            checkpoint_keys=keys or None, reason=reason)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'selection'}: {e['msg']}"
                                 for e in exc.errors(include_url=False))
            typer.echo(f"error: invalid_request: {problems}", err=True)
            raise typer.Exit(2) from None
    result = run_mutation(settings, action=audit_action, target=target, work=lambda session, clock:
                          service.change_dead_letters(session, selection=selection,
                                                      action=DeadLetterAction(action), actor=cli_actor(),
                                                      clock=clock).model_dump(mode="json"))
    typer.echo(f"{model}/{session_class}: {len(result['changed'])} now {result['state']}, "
               f"{len(result['unchanged'])} already {result['state']}")
    for key in result["changed"]:
        typer.echo(f"  {key}")


KeysArg = Annotated[list[str] | None, typer.Argument(help="Checkpoint keys (kv/<root>/manifests/<hash>.json).")]
AllFlag = Annotated[bool, typer.Option("--all", help="Every letter in the dead state.")]
ReasonOpt = Annotated[str, typer.Option(help="Why, for the event log.")]


@dead_letters_app.command("retry")
def dead_letters_retry(model: str, session_class: str, reason: ReasonOpt, keys: KeysArg = None,
                       every: AllFlag = False) -> None:
    """Copy these checkpoints again (the next sweep plans them), as POST …/dead-letters/retry."""
    _change_dead_letters("retry", model, session_class, keys, every, reason)


@dead_letters_app.command("clear")
def dead_letters_clear(model: str, session_class: str, reason: ReasonOpt, keys: KeysArg = None,
                       every: AllFlag = False) -> None:
    """Stop reporting these dead letters (sweeps still skip them), as POST …/dead-letters/clear."""
    _change_dead_letters("clear", model, session_class, keys, every, reason)


def _exec_celery(*args: str, **env: str) -> None:
    """Replace this process with Celery's own command on `controlplane.celery_app` (the composed app).

    Exec rather than import: a domain does not import the composition root, and the worker or beat is
    then exactly `celery -A controlplane.celery_app …`, signals and all (SIGTERM: warm shutdown).
    """
    import sys

    from pydantic import ValidationError

    from controlplane.replication.config import ReplicationSettings

    settings = load_settings()
    if settings.celery_broker_url is None:
        typer.echo("error: bad configuration: LIFELINE_CONTROLPLANE_CELERY_BROKER_URL is not set; a worker and a "
                   "beat need a broker (amqp://… or redis://…)", err=True)
        raise typer.Exit(2)
    os.environ.update(env)
    try:
        replication = ReplicationSettings()
    except ValidationError as exc:
        typer.echo(f"error: bad configuration:\n{exc}", err=True)
        raise typer.Exit(2) from exc
    argv = [sys.executable, "-m", "celery", "-A", "controlplane.celery_app", *args]
    if args[0] == "worker":
        argv += ["-Q", replication.queue]
    sys.stdout.flush()
    os.execv(sys.executable, argv)


@replication_app.command()
def worker(
    metrics_port: Annotated[int | None, typer.Option(min=1, max=65535, help="Serve Prometheus metrics here.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Copies at once (threads).")] = 1,
    loglevel: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Run a Celery worker on the replication queue (LIFELINE_REPLICATION_QUEUE)."""
    # One process (solo, or threads): the metrics in this process's registry are all of the worker's.
    pool = "solo" if concurrency == 1 else "threads"
    env = {"LIFELINE_REPLICATION_METRICS_PORT": str(metrics_port)} if metrics_port is not None else {}
    # A node name of its own: two workers named celery@<host> on one broker fight over one exclusive
    # remote-control queue, and the second dies at start (RabbitMQ: 405 RESOURCE_LOCKED).
    _exec_celery("worker", f"--hostname=replication-{os.getpid()}@%h", f"--pool={pool}",
                 f"--concurrency={concurrency}", "--without-gossip", "--without-mingle", f"--loglevel={loglevel}", **env)


@replication_app.command()
def beat(loglevel: Annotated[str, typer.Option()] = "INFO") -> None:
    """Run Celery beat: sweeps the policies every LIFELINE_REPLICATION_SWEEP_EVERY (and the drill cadence)."""
    settings = load_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    _exec_celery("beat", f"--loglevel={loglevel}", f"--schedule={settings.data_dir / 'celerybeat-schedule'}")


@replication_app.command()
def status(model: Annotated[str | None, typer.Option()] = None, as_json: JsonFlag = False) -> None:
    """Per policy: pending checkpoints, lag, totals and dead letters, as GET /api/v1/replication/status."""
    from common.clock import SystemClock
    from controlplane.replication import service

    report = read_only(load_settings(), lambda session: service.status(session, clock=SystemClock(), model=model)
                       .model_dump(mode="json"))
    if as_json:
        _print_json(report)
        return
    for row in report["policies"]:
        lag = "-" if row["lag_seconds"] is None else f"{row['lag_seconds']:.1f}s"
        typer.echo(f"{row['model']}/{row['session_class']} {row['mode']}: pending {row['pending']}, lag {lag} "
                   f"(RPO_context {row['rpo_context_seconds']}s), replicated {row['replicated_total']}, "
                   f"dead letters {len(row['dead_letters'])}")
        for letter in row["dead_letters"]:
            typer.echo(f"  dead letter ({letter['state']}) {letter['checkpoint_key']} after {letter['attempts']}: "
                       f"{letter['error']}")


if __name__ == "__main__":  # pragma: no cover - `python -m controlplane.replication.cli worker`, as `lifeline replication`
    replication_app()
