"""`lifeline catalog register|list|show|verify|promote|rollback|issue add|issue resolve|canary record`.

The CLI talks to the database through the service layer, not to the API:
registering hashes gigabytes where the artifact is (an operator's host next
to the bucket or the NFS mount), not inside the API process; and a weight
rollback must still work when the control-plane API is the thing that is
down. Every mutation is audited and writes the same events as the API.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from controlplane.cli_support import audited_command, cli_actor, fail, load_settings, read_only, run_mutation
from weight_catalog.canary_cli import canary_app

catalog_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Weight-version catalog.")
issue_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Known issues of a version.")
catalog_app.add_typer(issue_app, name="issue")
catalog_app.add_typer(canary_app, name="canary")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def _hash_with_progress(description: str, total: int, run: Any) -> Any:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task(description, total=total)
        return run(lambda n: progress.advance(task, n))


@catalog_app.command()
def register(
    model: str,
    version: str,
    location: Annotated[str, typer.Argument(help="A directory or s3://bucket/prefix.")],
    workers: Annotated[int | None, typer.Option(help="Shards hashed at once.")] = None,
) -> None:
    """Hash every shard of an artifact and register it as MODEL VERSION."""
    from pydantic import TypeAdapter, ValidationError

    from controlplane.types import Name
    from weight_catalog import service
    from weight_catalog.store import open_store

    settings = load_settings()
    action, target = "catalog.register", f"model:{model}/version:{version}"
    # Audited from the first check on: a refused name or an unreadable
    # artifact is a failed mutation too.
    with audited_command(settings, action=action, target=target):
        try:
            TypeAdapter(Name).validate_python(model)
            TypeAdapter(Name).validate_python(version)
        except ValidationError as exc:
            fail("invalid_request", f"model and version must be names matching [A-Za-z0-9._-]: {exc}", code=2)
        read_only(settings, lambda session: service.ensure_version_absent(session, model=model, version=version))
        store = open_store(location, s3_endpoint_url=settings.s3_endpoint_url)
        files = store.list_files()
        scan = _hash_with_progress(
            f"hashing {len(files)} files",
            sum(files.values()),
            lambda advance: service.scan_artifact(
                store, workers=workers or settings.hash_workers, block_bytes=settings.hash_block_bytes,
                progress=advance, files=files,
            ),
        )
        created = run_mutation(
            settings,
            action=action,
            target=target,
            work=lambda session, clock: service.create_version(
                session, model=model, version=version, scan=scan, actor=cli_actor(), clock=clock
            ),
        )
    typer.echo(f"registered {model} {version}: {len(scan.shards)} files, {created.total_bytes} bytes, "
               f"fingerprint {created.fingerprint[:16]}")


@catalog_app.command("list")
def list_versions(model: Annotated[str | None, typer.Option()] = None, as_json: JsonFlag = False) -> None:
    """List registered versions."""
    from rich.console import Console
    from rich.table import Table

    from weight_catalog import service
    from weight_catalog.schemas import VersionSummary

    settings = load_settings()
    rows = read_only(
        settings,
        lambda session: [
            {**VersionSummary.model_validate(v).model_dump(mode="json"),
             "open_issues": sum(1 for i in v.issues if i.resolved_at is None)}
            for v in service.list_versions(session, model=model)
        ],
    )
    if as_json:
        _print_json(rows)
        return
    table = Table("model", "version", "bytes", "fingerprint", "open issues", "registered")
    for row in rows:
        table.add_row(row["model"], row["version"], str(row["total_bytes"]), row["fingerprint"][:16],
                      str(row["open_issues"]), row["registered_at"])
    Console().print(table)


@catalog_app.command()
def show(model: str, version: str) -> None:
    """Show one version: shards, fingerprint parts, known issues (JSON)."""
    from weight_catalog import service
    from weight_catalog.schemas import VersionRead

    settings = load_settings()
    _print_json(read_only(
        settings,
        lambda session: VersionRead.model_validate(
            service.get_version_or_raise(session, model=model, version=version)
        ).model_dump(mode="json"),
    ))


@catalog_app.command()
def verify(
    model: str,
    version: str,
    location: Annotated[str | None, typer.Option(help="Where to re-hash; default: where it was registered.")] = None,
    workers: Annotated[int | None, typer.Option()] = None,
    as_json: JsonFlag = False,
) -> None:
    """Re-hash a version and recompute its fingerprint; record the outcome; exit 1 if unhealthy."""
    from weight_catalog import service
    from weight_catalog import verify as verification
    from weight_catalog.store import open_store

    settings = load_settings()
    action, target = "catalog.verify", f"model:{model}/version:{version}"
    with audited_command(settings, action=action, target=target):
        # Read what was recorded, then hash with no transaction open.
        def recorded(session: Any) -> tuple[str, list[Any], dict[str, str]]:
            found = service.get_version_or_raise(session, model=model, version=version)
            expected = service.expected_shards(session, model=model, version=version)
            return found.location, expected, dict(found.fingerprint_parts)

        found_location, expected, expected_parts = read_only(settings, recorded)
        store = open_store(location or found_location, s3_endpoint_url=settings.s3_endpoint_url)
        report = _hash_with_progress(
            f"verifying {len(expected)} files",
            sum(s.size for s in expected),
            lambda advance: verification.verify_against(
                model=model, version=version, expected=expected, expected_parts=expected_parts, store=store,
                workers=workers or settings.hash_workers, block_bytes=settings.hash_block_bytes, progress=advance,
            ),
        )
        run_mutation(settings, action=action, target=target, work=lambda session, clock: verification.record_verify(
            session, report=report, actor=cli_actor(), clock=clock))
    if as_json:
        _print_json(report.model_dump(mode="json"))
    else:
        for m in report.mismatched:
            typer.echo(f"MISMATCH {m.path}: expected {m.expected_sha256} ({m.expected_size} B), "
                       f"got {m.actual_sha256} ({m.actual_size} B)")
        for path in report.missing:
            typer.echo(f"MISSING  {path}")
        for path in report.unexpected:
            typer.echo(f"EXTRA    {path} (not part of the version; counts only through the fingerprint)")
        for part in report.fingerprint_drift:
            typer.echo(f"DRIFT    {part} (the semantic fingerprint part no longer matches)")
        typer.echo(f"{'healthy' if report.healthy else 'UNHEALTHY'}: {report.checked} files checked at {report.location}")
    if not report.healthy:
        raise typer.Exit(1)


@catalog_app.command()
def promote(
    model: str,
    alias: str,
    version: str,
    reason: Annotated[str, typer.Option(help="Why; required with --force.")] = "",
    force: Annotated[bool, typer.Option(help="Override fingerprint and critical-issue guards.")] = False,
) -> None:
    """Point ALIAS of MODEL at VERSION (compare-and-set), writing an event."""
    from weight_catalog import aliases

    settings = load_settings()
    move = run_mutation(
        settings,
        action="catalog.promote",
        target=f"model:{model}/alias:{alias}",
        work=lambda session, clock: aliases.promote(
            session, model=model, alias=alias, version=version, actor=cli_actor(), reason=reason, force=force,
            clock=clock,
        ),
    )
    typer.echo(f"{model} {alias} -> {version} (revision {move.revision}, event {move.event_id})")


@catalog_app.command()
def rollback(
    model: str,
    alias: str,
    reason: Annotated[str, typer.Option(help="Why the alias goes back.")],
    force: Annotated[bool, typer.Option(help="Override the critical-issue guard.")] = False,
) -> None:
    """Return ALIAS to the version it held before its latest promote, in one step."""
    from weight_catalog import aliases, repository

    settings = load_settings()
    move = run_mutation(
        settings,
        action="catalog.rollback",
        target=f"model:{model}/alias:{alias}",
        work=lambda session, clock: aliases.rollback(
            session, model=model, alias=alias, actor=cli_actor(), reason=reason, force=force, clock=clock
        ),
    )
    labels = read_only(settings, lambda session: repository.version_labels(session, {move.to_version_id}))
    typer.echo(f"{model} {alias} -> {labels[move.to_version_id]} (revision {move.revision}, event {move.event_id})")


@issue_app.command("add")
def issue_add(
    model: str,
    version: str,
    severity: Annotated[str, typer.Option(help="low | medium | high | critical")],
    title: Annotated[str, typer.Option()],
    description: Annotated[str, typer.Option()] = "",
) -> None:
    """Record a known issue against a version."""
    from weight_catalog import known_issues
    from weight_catalog.models import Severity

    settings = load_settings()
    with audited_command(settings, action="catalog.issue.add", target=f"model:{model}/version:{version}"):
        try:
            parsed = Severity(severity)
        except ValueError:
            fail("invalid_request", f"severity must be one of {', '.join(s.value for s in Severity)}", code=2)
    issue = run_mutation(
        settings,
        action="catalog.issue.add",
        target=f"model:{model}/version:{version}",
        work=lambda session, clock: known_issues.add_issue(
            session, model=model, version=version, severity=parsed, title=title, description=description,
            actor=cli_actor(), clock=clock,
        ),
    )
    typer.echo(f"known issue #{issue.id} ({parsed.value}) on {model} {version}")


@issue_app.command("resolve")
def issue_resolve(issue_id: int, resolution: Annotated[str, typer.Option()] = "") -> None:
    """Mark a known issue resolved."""
    from weight_catalog import known_issues

    settings = load_settings()
    run_mutation(
        settings,
        action="catalog.issue.resolve",
        target=f"issue:{issue_id}",
        work=lambda session, clock: known_issues.resolve_issue(
            session, issue_id=issue_id, resolution=resolution, actor=cli_actor(), clock=clock
        ),
    )
    typer.echo(f"known issue #{issue_id} resolved")
