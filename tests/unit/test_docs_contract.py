"""The lists the docs state, read against the code that defines them, so a doc cannot drift from the code.

Four kinds of list, each parsed from the Markdown and compared with what the
source defines (read with `ast`, never by running a process):

- **metrics**: every `lifeline_…` series a page names (a full name, `…_suffix`
  after a full one, or a `prefix_*`) is one a prometheus_client definition
  exports, and the labels it shows in `{…}` are that metric's; the pages
  that list a component's metrics (docs/gateway.md "Metrics", the replication
  collector in docs/kv_checkpoints.md) name every one of them.
- **error types**: every type a page gives with its status ("409 `x`",
  "`x` (409)", "`x` 409") or in a table of types is one the code can put in
  an error body, with that status; docs/controlplane.md's Errors section
  lists every error class of the admin API under its status.
- **settings**: every `LIFELINE_<PROCESS>_…` variable a page names is a
  field of that process's settings class, and a settings table's default is
  the field's; the table of docs/controlplane.md is all of
  `ControlPlaneSettings`; docs/gateway.md's configuration block is
  `GatewaySettings` with its defaults.
- **the snapshot's shape** in docs/controlplane.md is `RoutingSnapshot`'s
  fields (and its versions' and aliases').

A failure names the page, the line and the name. A page may name metrics that
do not exist yet only in a section that says so (PROPOSALS).
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The code that can define a metric, an error type or a setting: every package, not the tests or migrations.
SOURCE_EXCLUDED = ("tests/", "migrations/", ".lifeline/", "deploy/")


def pages() -> list[Path]:
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


@cache
def source_files() -> tuple[Path, ...]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return tuple(ROOT / p for p in listed if not p.startswith(SOURCE_EXCLUDED) and (ROOT / p).is_file())


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


# --- Markdown: lines, sections, paragraphs --------------------------------------------------------------------


@dataclass(frozen=True)
class Passage:
    """A paragraph (lines joined) or one table row, where it starts, and the heading above it."""

    page: Path
    line: int
    section: str
    text: str
    starts_table: bool = False  # a table row whose line above is no table row: the header

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@cache
def passages(page: Path) -> tuple[Passage, ...]:
    """Paragraphs and table rows; a fenced block's lines are each a passage (a YAML or shell line names things too)."""
    found: list[Passage] = []
    section, fenced, in_table = "", False, False
    start, held = 0, []

    def flush() -> None:
        if held:
            found.append(Passage(page, start, section, " ".join(held)))
            held.clear()

    for number, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced or stripped.startswith("|"):
            flush()
            row = stripped.startswith("|") and not fenced
            found.append(Passage(page, number, section, stripped, starts_table=row and not in_table))
            in_table = row
            continue
        in_table = False
        if not fenced and re.match(r"#{1,6} ", stripped):
            flush()
            section = stripped.lstrip("#").strip()
            continue
        if not stripped or re.match(r"([-*]|\d+\.) ", stripped):  # a blank line or a list item starts anew
            flush()
        if stripped:
            if not held:
                start = number
            held.append(stripped)
    flush()
    return tuple(found)


def table_cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def without_parentheses(text: str) -> str:
    """The text with every balanced (…) removed: what a list item says about itself, not its explanation."""
    out, depth = [], 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif not depth:
            out.append(char)
    return "".join(out)


# --- Python source: constant expressions ----------------------------------------------------------------------


class NotConstant(Exception):
    pass


def module_constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level names bound once to a constant string, or a list/tuple of them."""
    constants: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target.id, node.value
        else:
            continue
        try:
            constants[target] = evaluate(value, constants)
        except NotConstant:
            pass
    return constants


def evaluate(node: ast.AST | None, env: dict[str, Any]) -> Any:
    """A constant expression's value: literals, names bound in `env`, `+`, f-strings, lists, `a or b`."""
    if node is None:
        raise NotConstant("nothing")
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise NotConstant(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return evaluate(node.left, env) + evaluate(node.right, env)
    if isinstance(node, ast.JoinedStr):
        return "".join(str(evaluate(v.value, env)) if isinstance(v, ast.FormattedValue) else str(v.value)
                       for v in node.values)
    if isinstance(node, ast.List | ast.Tuple):
        items: list[Any] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                items.extend(evaluate(element.value, env))
            else:
                items.append(evaluate(element, env))
        return items
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        value = None
        for operand in node.values:
            value = evaluate(operand, env)
            if value:
                return value
        return value
    raise NotConstant(ast.dump(node)[:60])


def callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def bind(function: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, env: dict[str, Any]) -> dict[str, Any]:
    """`function`'s parameters as `call` passes them (defaults where it does not), evaluated in `env`."""
    params = [a.arg for a in function.args.args if a.arg not in ("self", "cls")]
    defaults = dict(zip(reversed(params), reversed(function.args.defaults), strict=False))
    bound: dict[str, Any] = {}
    for name in params:
        if name in defaults:
            bound[name] = evaluate(defaults[name], env)
    for name, value in zip(params, call.args, strict=False):
        bound[name] = evaluate(value, env)
    for keyword in call.keywords:
        if keyword.arg in params:
            bound[keyword.arg] = evaluate(keyword.value, env)
    return {**env, **bound}


def functions_with_parents(tree: ast.Module) -> Iterator[tuple[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef | None]]:
    """Every node, with the innermost function it is in (None at module or class level)."""
    def walk(node: ast.AST, function: ast.FunctionDef | ast.AsyncFunctionDef | None) -> Iterator[Any]:
        for child in ast.iter_child_nodes(node):
            yield child, function
            yield from walk(child, child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function)

    yield from walk(tree, None)


# --- metrics ----------------------------------------------------------------------------------------------------

METRIC_KINDS = {
    "Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary", "Info": "info",
    "CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge", "HistogramMetricFamily": "histogram",
    "SummaryMetricFamily": "summary", "InfoMetricFamily": "info",
}
# A prometheus_client constructor's arguments: (name, documentation, labelnames, …); a *MetricFamily's labels
# are a keyword (its third positional is a value).
LABEL_POSITION = {"Counter": 2, "Gauge": 2, "Histogram": 2, "Summary": 2, "Info": 2}


@dataclass(frozen=True)
class MetricDefinition:
    name: str
    kind: str
    labels: tuple[str, ...] | None  # None: not a constant the scan could read
    path: Path
    line: int

    def series(self) -> set[str]:
        """The names Prometheus stores: the family name and the suffixes prometheus_client adds."""
        if self.kind == "counter":
            base = self.name.removesuffix("_total")
            return {base, f"{base}_total", f"{base}_created"}
        if self.kind in ("histogram", "summary"):
            extra = {"_bucket"} if self.kind == "histogram" else set()
            return {self.name, *(self.name + s for s in {"_sum", "_count", "_created", *extra})}
        if self.kind == "info":
            return {self.name, f"{self.name}_info"}
        return {self.name}

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _metric_definition(call: ast.Call, env: dict[str, Any], path: Path) -> MetricDefinition:
    name_node = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "name"), None)
    name = evaluate(name_node, env)
    kind = callee(call)
    label_node = next((k.value for k in call.keywords if k.arg in ("labelnames", "labels")), None)
    position = LABEL_POSITION.get(kind)
    if label_node is None and position is not None and len(call.args) > position:
        label_node = call.args[position]
    try:
        labels = tuple(evaluate(label_node, env) or ()) if label_node is not None else ()
    except NotConstant:
        labels = None
    return MetricDefinition(name, METRIC_KINDS[kind], labels, path, call.lineno)


def prometheus_names(tree: ast.Module) -> set[str]:
    """The metric constructors a module imports from prometheus_client (not `collections.Counter`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "prometheus_client":
            names |= {alias.asname or alias.name for alias in node.names if alias.name in METRIC_KINDS}
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "prometheus_client" for a in node.names):
            names |= set(METRIC_KINDS)  # `prometheus_client.Counter(...)`: an attribute call, read by its name
    return names


BOUNDED_SCRAPE = ROOT / "controlplane" / "bounded_scrape.py"


@cache
def metric_definitions() -> tuple[MetricDefinition, ...]:
    """Every prometheus_client metric the source defines, found in its constructor calls.

    A name is a constant expression in the module (`PREFIX + "lag_seconds"`); where it is a parameter of
    the function that builds the metric (a local `gauge(name, text)` helper), each call of that function
    in the module gives one. A subclass of `BoundedCollector` (controlplane/bounded_scrape.py) exports
    `<its module's PREFIX>scrape_ok`.
    """
    found: list[MetricDefinition] = []
    for path in source_files():
        tree = parsed(path)
        env = module_constants(tree)
        constructors = prometheus_names(tree)
        factories: dict[str, tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.Call]] = {}
        for node, function in functions_with_parents(tree):
            if not (isinstance(node, ast.Call) and callee(node) in constructors):
                continue
            try:
                found.append(_metric_definition(node, env, path))
            except NotConstant:
                if function is None:
                    raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno}: a metric whose name the scan "
                                         f"cannot read; give it a constant name") from None
                factories[function.name] = (function, node)
        if path == BOUNDED_SCRAPE:  # its scrape_ok is named by each subclass's PREFIX: read there, below
            factories.pop("_scrape_ok", None)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "BoundedCollector" for b in node.bases):
                found.append(MetricDefinition(env["PREFIX"] + "scrape_ok", "gauge", (), path, node.lineno))
        built = set()
        for node, _ in functions_with_parents(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in factories:
                function, metric = factories[node.func.id]
                found.append(_metric_definition(metric, bind(function, node, env), path))
                built.add(node.func.id)
        for name in set(factories) - built:
            raise AssertionError(f"{path.relative_to(ROOT)}:{factories[name][1].lineno}: a metric built in "
                                 f"{name}() from a name the scan cannot read, and no call of {name}() in the module")
    return tuple(found)


@cache
def exported_series() -> dict[str, MetricDefinition]:
    return {series: d for d in metric_definitions() for series in d.series()}


# Names in the docs that look like metrics and are not: each is a literal the code uses as what the doc says.
NOT_METRICS = {
    "lifeline_console": "the console's session cookie (controlplane/console/session.py)",
    "lifeline_console_signin": "the console's sign-in cookie (controlplane/console/session.py)",
    "lifeline_sampler": "the vllm_xargs key of the sampler question (contract/sampling.py)",
    "lifeline_checkpoint": "the kv_transfer_params key of the checkpoint request (contract/session.py)",
    "lifeline_vllm": "the vLLM plugin package (lifeline_vllm/)",
}
# Sections that name metrics the code does not export yet, and say so in their heading.
PROPOSALS: set[tuple[str, str]] = set()  # none at present: every alert issue 30 asked for has its metric

METRIC_NAME = re.compile(r"(?<![\w.:/-])(lifeline_[a-z0-9_]+)(\*)?(\{[^}]*\})?")
METRIC_SUFFIX = re.compile(r"…(_[a-z0-9_]+)(\{[^}]*\})?")


@dataclass(frozen=True)
class NamedMetric:
    passage: Passage
    name: str  # a full name, "_suffix" (after "…"), or a prefix ending in "_" (before "*")
    form: str  # "full", "suffix", "prefix"
    labels: tuple[str, ...]


def _labels(braces: str | None) -> tuple[str, ...]:
    if not braces:
        return ()
    parts = (part.split("=", 1)[0].strip() for part in braces.strip("{}").split(","))
    return tuple(p for p in parts if re.fullmatch(r"[a-z_][a-z0-9_]*", p))


def named_metrics(page: Path) -> Iterator[NamedMetric]:
    relative = str(page.relative_to(ROOT))
    for passage in passages(page):
        if (relative, passage.section) in PROPOSALS:
            continue
        for match in METRIC_NAME.finditer(passage.text):
            name, star, braces = match.groups()
            if name in NOT_METRICS:
                continue
            form = "prefix" if star or name.endswith("_") else "full"
            yield NamedMetric(passage, name, form, _labels(braces))
        for match in METRIC_SUFFIX.finditer(passage.text):
            if passage.text[max(0, match.start() - 1):match.start()].isalnum():
                continue
            yield NamedMetric(passage, match.group(1), "suffix", _labels(match.group(2)))


def resolve(named: NamedMetric) -> list[MetricDefinition]:
    """The definitions a doc's name can mean: one for a full name; every match for a suffix or a prefix."""
    series = exported_series()
    if named.form == "full":
        return [series[named.name]] if named.name in series else []
    if named.form == "prefix":
        return [d for s, d in series.items() if s.startswith(named.name)]
    return [d for s, d in series.items() if s.endswith(named.name) and s.startswith("lifeline_")]


def test_the_metric_scan_sees_every_metric_the_registries_hold() -> None:
    """The scan is worth something only if it finds what the processes really register."""
    import importlib

    import prometheus_client

    for module in ("controlplane.drill.metrics", "controlplane.replication.metrics", "cutover.metrics"):
        importlib.import_module(module)  # each registers its metrics on the default registry on import
    from engine.metrics import EngineMetrics
    from gateway.metrics import GatewayMetrics
    from warm_pool.agent import AgentMetrics

    registries = [GatewayMetrics().registry, AgentMetrics().registry, EngineMetrics().registry,
                  prometheus_client.REGISTRY]
    scanned = {d.name.removesuffix("_total") if d.kind == "counter" else d.name: d for d in metric_definitions()}
    for registry in registries:
        for family in registry.collect():
            if family.name.startswith(("lifeline_", "vllm:")):
                assert family.name in scanned, f"{family.name} is registered, and the scan of the source missed it"
                labels = scanned[family.name].labels
                samples_labels = {k for s in family.samples for k in s.labels} - {"le", "quantile"}
                assert labels is None or samples_labels <= set(labels), family.name
    assert {"lifeline_controlplane_replication_lag_rpo_ratio", "lifeline_controlplane_replication_dead_letters",
            "lifeline_controlplane_requests_total"} <= set(exported_series()), "the scan missed the built names"


def test_every_metric_a_page_names_is_one_the_code_exports() -> None:
    unknown, wrong_labels = [], []
    for page in pages():
        for named in named_metrics(page):
            definitions = resolve(named)
            shown = ("…" if named.form == "suffix" else "") + named.name + ("*" if named.form == "prefix" else "")
            if not definitions:
                unknown.append(f"{named.passage.where()}: `{shown}`")
                continue
            if named.labels and not any(d.labels is None or set(named.labels) <= {*d.labels, "le"}
                                        for d in definitions):
                have = "; ".join(f"{d.name}{{{','.join(d.labels or ())}}}" for d in definitions)
                wrong_labels.append(f"{named.passage.where()}: `{shown}{{{','.join(named.labels)}}}`, the code: {have}")
    assert not unknown, ("the docs name metrics no prometheus_client definition exports (fix the name, or, for a "
                         "metric still to be written, say so in a section listed in PROPOSALS):\n"
                         + "\n".join(unknown))
    assert not wrong_labels, "the docs give metrics labels they do not have:\n" + "\n".join(wrong_labels)


def test_no_name_set_aside_as_not_a_metric_is_one() -> None:
    literals = {node.value for path in source_files() for node in ast.walk(parsed(path))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    for name, what in NOT_METRICS.items():
        assert name not in exported_series(), f"{name} is a metric now, not {what}: take it out of NOT_METRICS"
        assert name in literals or (ROOT / name).is_dir(), f"{name} ({what}) is no longer in the code"
    for page, section in PROPOSALS:
        if (ROOT / page).exists():
            assert section in {p.section for p in passages(ROOT / page)}, f"{page} has no section {section!r}"


def _names_on(page: Path, section: str | None = None) -> tuple[set[str], set[str]]:
    """Full names and `…_suffix`es a page (or one of its sections) names."""
    full, suffixes = set(), set()
    for named in named_metrics(page):
        if section is None or named.passage.section == section:
            (full if named.form == "full" else suffixes).add(named.name)
    return full, suffixes


def _unnamed(definitions: list[MetricDefinition], full: set[str], suffixes: set[str]) -> list[str]:
    return [f"{d.where()}: {d.name}" for d in definitions
            if not (d.series() & full or any(s.endswith(x) for s in d.series() for x in suffixes))]


def test_the_gateway_page_names_every_metric_the_gateway_exports() -> None:
    page = ROOT / "docs" / "gateway.md"
    gateway = [d for d in metric_definitions() if d.path.is_relative_to(ROOT / "gateway")]
    assert gateway
    listed = [d for d in gateway if d.path == ROOT / "gateway" / "metrics.py"]
    missing = _unnamed(listed, *_names_on(page, "Metrics"))
    assert not missing, "docs/gateway.md's Metrics section does not name these (gateway/metrics.py):\n" + \
        "\n".join(missing)
    missing = _unnamed(gateway, *_names_on(page))
    assert not missing, "docs/gateway.md does not name these gateway metrics:\n" + "\n".join(missing)


def test_the_replication_section_names_every_series_of_the_collector() -> None:
    page = ROOT / "docs" / "kv_checkpoints.md"
    section = "Lag and RPO_context on the control plane's `/metrics`"
    collector = [d for d in metric_definitions()
                 if d.path == ROOT / "controlplane" / "replication" / "exposition.py"]
    assert collector
    missing = _unnamed(collector, *_names_on(page, section))
    assert not missing, f"docs/kv_checkpoints.md's {section!r} does not name these:\n" + "\n".join(missing)


# --- error types ------------------------------------------------------------------------------------------------

# Callables whose argument at this position (or keyword) becomes an error body's `type` by a path the scan does
# not follow: a gateway `Decision`'s reason is the type of the stream's end (gateway/recovery.py raises
# `self._impossible(decision.reason, …)`).
TYPE_CARRIERS_BY_HAND = {"Decision": (1, "reason")}
ERROR_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # snake_case, and the engine's vLLM names (`BadRequestError`)


@cache
def error_classes() -> dict[str, list[type]]:
    """Every LifelineError subclass of the source (each errors.py and contract/ imported), by class name."""
    import importlib

    from common.errors import LifelineError

    for path in source_files():
        relative = path.relative_to(ROOT)
        if path.name == "errors.py" or relative.parts[0] == "contract" or relative == Path("cutover/drivers/base.py"):
            importlib.import_module(".".join(relative.with_suffix("").parts).removesuffix(".__init__"))
    by_name: dict[str, list[type]] = {}
    pending = [LifelineError]
    while pending:
        cls = pending.pop()
        if cls.__module__.split(".")[0] != "tests":
            by_name.setdefault(cls.__name__, []).append(cls)
        pending.extend(cls.__subclasses__())
    return by_name


def _class_called(call: ast.Call, tree: ast.Module, path: Path) -> type | None:
    """The error class `call` constructs, resolved through the module's imports (None when it is no such class)."""
    return _class_named(callee(call), tree, path)


def _class_named(name: str, tree: ast.Module, path: Path) -> type | None:
    """The error class `name` means in the module `tree` (by its imports when several have that name)."""
    candidates = error_classes().get(name, [])
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            module = node.module or module
    return next((c for c in candidates if c.__module__ == module), None)


def _type_carriers() -> dict[str, tuple[int, str]]:
    """Functions and classes one of whose parameters is passed on as an error's `type` (found to a fixpoint).

    `RecoveryImpossible(reason, message)` passes `type=reason` to its base; `_impossible(reason, message)`
    passes `reason` on to `RecoveryImpossible`; each is then a carrier at that position.
    """
    carriers: dict[str, tuple[int, str]] = dict(TYPE_CARRIERS_BY_HAND)
    definitions: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for path in source_files():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        definitions.append((node.name, item))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name != "__init__":
                definitions.append((node.name, node))
    changed = True
    while changed:
        changed = False
        for name, function in definitions:
            if name in carriers:
                continue
            params = [a.arg for a in function.args.args if a.arg not in ("self", "cls")]
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                passed = [k.value for k in call.keywords if k.arg in ("type", "error_type")]
                if callee(call) in carriers:
                    position, keyword = carriers[callee(call)]
                    passed += call.args[position:position + 1] + [k.value for k in call.keywords if k.arg == keyword]
                hit = next((p.id for p in passed if isinstance(p, ast.Name) and p.id in params), None)
                if hit is not None:
                    carriers[name] = (params.index(hit), hit)
                    changed = True
                    break
    return carriers


@dataclass
class EmittedType:
    where: str  # the first place the scan found it
    statuses: set[int]  # the HTTP statuses it is sent with, where the scan could tell


@cache
def error_types_in_code() -> dict[str, EmittedType]:
    """Every string the code puts, or can put, in an error body's `type`, and with which statuses.

    Read from: an error class's `error_type` (its `status_code`), a module's `…ERROR_TYPE`, `type=` /
    `error_type=` in a call (an error class's status, or the call's `status_code=`), `error_body("…")`, a
    dict literal's `"type"`, a status → type table (`{404: "not_found"}.get(status, "http_error")`), and the
    arguments of the type carriers above.
    """
    carriers = _type_carriers()
    found: dict[str, EmittedType] = {}

    def add(node: ast.AST | None, path: Path, status: int | None = None) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ERROR_TYPE.fullmatch(node.value):
            emitted = found.setdefault(node.value, EmittedType(f"{path.relative_to(ROOT)}:{node.lineno}", set()))
            if status is not None:
                emitted.statuses.add(status)

    for classes in error_classes().values():
        for cls in classes:
            if "error_type" in vars(cls) or "status_code" in vars(cls):
                emitted = found.setdefault(cls.error_type, EmittedType(f"{cls.__module__}.{cls.__qualname__}", set()))
                emitted.statuses.add(cls.status_code)
    for path in source_files():
        tree = parsed(path)
        for node in tree.body:  # an error class of a module error_classes() did not import
            if isinstance(node, ast.ClassDef):
                own = {t.id: s.value.value for s in node.body if isinstance(s, ast.Assign) for t in s.targets
                       if isinstance(t, ast.Name) and isinstance(s.value, ast.Constant)}
                status = own.get("status_code")
                if status is None and node.bases and isinstance(node.bases[0], ast.Name):
                    base = _class_named(node.bases[0].id, tree, path)
                    status = getattr(base, "status_code", None)
                if isinstance(own.get("error_type"), str):
                    add(next(s.value for s in node.body if isinstance(s, ast.Assign)
                             and any(isinstance(t, ast.Name) and t.id == "error_type" for t in s.targets)),
                        path, status)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
                    if name == "error_type" or name.endswith("ERROR_TYPE"):
                        add(node.value, path)
            elif isinstance(node, ast.Call):
                status = next((k.value.value for k in node.keywords if k.arg == "status_code"
                               and isinstance(k.value, ast.Constant) and isinstance(k.value.value, int)), None)
                cls = _class_called(node, tree, path)
                status = status if status is not None else getattr(cls, "status_code", None)
                for keyword in node.keywords:
                    if keyword.arg in ("type", "error_type"):
                        add(keyword.value, path, status)
                if callee(node) == "error_body" and node.args:
                    add(node.args[0], path)
                table = getattr(node.func, "value", None)
                if callee(node) == "get" and _status_table(table) and len(node.args) > 1:
                    add(node.args[1], path)  # `{404: "not_found"}.get(status, "http_error")`
                if callee(node) in carriers:
                    position, keyword_name = carriers[callee(node)]
                    add(node.args[position] if len(node.args) > position else None, path, status)
                    for keyword in node.keywords:
                        if keyword.arg == keyword_name:
                            add(keyword.value, path, status)
            elif isinstance(node, ast.Dict):
                keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
                if "type" in keys:
                    add(node.values[keys.index("type")], path)
                if _status_table(node):
                    for key, value in zip(keys, node.values, strict=True):
                        add(value, path, key)
    return found


def _status_table(node: ast.AST | None) -> bool:
    """A dict literal from HTTP error statuses to types."""
    return isinstance(node, ast.Dict) and bool(node.keys) and all(
        isinstance(k, ast.Constant) and isinstance(k.value, int) and 400 <= k.value < 600 for k in node.keys)


def test_the_error_scan_sees_every_error_class_and_carrier() -> None:
    """Every LifelineError subclass's own type is found with its status, and the carriers by hand still carry."""
    emitted = error_types_in_code()
    missing = [f"{c.__module__}.{c.__qualname__}: {c.error_type} ({c.status_code})"
               for classes in error_classes().values() for c in classes
               if c.status_code not in emitted.get(c.error_type, EmittedType("", set())).statuses]
    assert not missing, "the scan missed these error classes' types:\n" + "\n".join(missing)
    assert {404, 405} <= emitted["not_found"].statuses | emitted["method_not_allowed"].statuses
    assert "http_error" in emitted
    assert emitted["force_needs_reason"].statuses == {422}  # `InvalidInput(…, type="force_needs_reason")`
    carriers = _type_carriers()
    assert {"RecoveryImpossible", "_impossible"} <= set(carriers), carriers
    recovery = (ROOT / "gateway" / "recovery.py").read_text()
    assert "_impossible(decision.reason" in recovery, (
        "gateway/recovery.py no longer raises a Decision's reason as the error type: "
        "update TYPE_CARRIERS_BY_HAND")


STATUS_THEN_TYPES = re.compile(r"(?<![\w.])([45]\d\d) (?=`)")
TYPE_THEN_STATUS = re.compile(r"`([A-Za-z][A-Za-z0-9_]*)` (?:\(([45]\d\d)\)|([45]\d\d)\b)")
LIST_ITEM = re.compile(r"`([A-Za-z][A-Za-z0-9_]*)`")


def _types_after_status(text: str, start: int) -> Iterator[str]:
    r"""`409 \`a\`, \`b\` (why), or \`c\``: the types listed after one status, up to the first other word."""
    rest = text[start:]
    while True:
        item = LIST_ITEM.match(rest)
        if item is None:
            return
        yield item.group(1)
        rest = rest[item.end():]
        explanation = re.match(r"\s*\(", rest)
        if explanation:
            depth, index = 0, explanation.end() - 1
            for index in range(explanation.end() - 1, len(rest)):
                depth += {"(": 1, ")": -1}.get(rest[index], 0)
                if depth == 0:
                    break
            rest = rest[index + 1:]
        separator = re.match(r"(?:,\s*(?:or\s+|and\s+)?|\s+or\s+|\s+and\s+)(?=`)", rest)
        if separator is None:
            return
        rest = rest[separator.end():]


@dataclass(frozen=True)
class ListedType:
    passage: Passage
    name: str
    status: int | None  # None where the page gives none (a stream's end mid-stream has no status)


def listed_error_types(page: Path) -> Iterator[ListedType]:
    """Every error type the page gives with its status, or in a table of types (`| type | … |`,
    `| status | types |`)."""
    table_kind: str | None = None
    for passage in passages(page):
        text = passage.text
        if text.startswith("|"):
            cells = table_cells(text)
            if set(text) <= set("|-: "):
                continue
            if passage.starts_table:
                header = [c.strip("`").lower() for c in cells]
                table_kind = header[0] if header[:1] == ["type"] or header[:2] == ["status", "types"] else None
                continue
            if table_kind == "type":
                first = re.match(r"`([A-Za-z][A-Za-z0-9_]*)`(?: \(([45]\d\d)\))?", cells[0])
                if first:
                    yield ListedType(passage, first.group(1), int(first.group(2)) if first.group(2) else None)
                continue
            if table_kind == "status" and len(cells) > 1:
                status = int(cells[0]) if re.fullmatch(r"[45]\d\d", cells[0]) else None
                for item in LIST_ITEM.findall(without_parentheses(cells[1])):
                    yield ListedType(passage, item, status)
                continue
        else:
            table_kind = None
        for match in STATUS_THEN_TYPES.finditer(text):
            for item in _types_after_status(text, match.end()):
                yield ListedType(passage, item, int(match.group(1)))
        for match in TYPE_THEN_STATUS.finditer(text):
            yield ListedType(passage, match.group(1), int(match.group(2) or match.group(3)))


def test_every_error_type_a_page_lists_is_one_the_code_emits_with_that_status() -> None:
    emitted = error_types_in_code()
    unknown, wrong_status = set(), set()
    for page in pages():
        for listed in listed_error_types(page):
            code = emitted.get(listed.name)
            if code is None:
                unknown.add(f"{listed.passage.where()}: `{listed.name}`")
            elif listed.status is not None and code.statuses and listed.status not in code.statuses:
                wrong_status.add(f"{listed.passage.where()}: {listed.status} `{listed.name}`, the code sends it with "
                                 f"{sorted(code.statuses)} ({code.where})")
    assert not unknown, "the docs list error types no code puts in an error body:\n" + "\n".join(sorted(unknown))
    assert not wrong_status, "the docs give error types another status than the code:\n" + \
        "\n".join(sorted(wrong_status))


# The admin API's error classes: each must be in docs/controlplane.md's Errors section under its status.
ADMIN_API_ERRORS = ("controlplane", "cutover.errors", "weight_catalog")


def test_the_controlplane_errors_section_lists_every_admin_api_error() -> None:
    page = ROOT / "docs" / "controlplane.md"
    listed = {(t.name, t.status) for t in listed_error_types(page) if t.passage.section == "Errors"}
    missing = sorted({f"{c.status_code} `{c.error_type}` ({c.__module__}.{c.__qualname__})"
                      for classes in error_classes().values() for c in classes
                      if c.__module__.startswith(ADMIN_API_ERRORS) and (c.error_type, c.status_code) not in listed})
    assert not missing, "docs/controlplane.md's Errors section does not list these under their status:\n" + \
        "\n".join(missing)


def test_the_error_type_parser_reads_each_form() -> None:
    page = ROOT / "docs" / "controlplane.md"
    listed = {(t.name, t.status) for t in listed_error_types(page)}
    assert {("unauthenticated", 401), ("replication_dead_letter_not_found", 404), ("invalid_artifact", 422),
            ("drill_not_found", 404), ("fault_not_injectable", 422), ("database_unavailable", 503),
            ("http_error", None)} <= listed
    assert not {name for name, _ in listed} & {"body", "NaN", "prod"}  # inside an explanation, not a type
    gateway = {(t.name, t.status) for t in listed_error_types(ROOT / "docs" / "gateway.md")}
    assert {("engine_failed", None), ("cancelled", 409), ("not_found_error", 404)} <= gateway
    text = "refused: 404 `a`, `b` (why, `c`), or `d`; 409 `e` with `f`; `g` 422 and `h` (503)"
    found = [(name, int(m.group(1))) for m in STATUS_THEN_TYPES.finditer(text)
             for name in _types_after_status(text, m.end())]
    found += [(m.group(1), int(m.group(2) or m.group(3))) for m in TYPE_THEN_STATUS.finditer(text)]
    assert found == [("a", 404), ("b", 404), ("d", 404), ("e", 409), ("g", 422), ("h", 503)]


# --- settings ---------------------------------------------------------------------------------------------------

NOT_PARSED = object()
REQUIRED = object()
DURATION_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "min": "minutes", "h": "hours"}


def _default(text: str) -> Any:
    """A table's default as a value: `unset`/`none`, `off`/`on`, `required`, `5s`, `2 min`, `8 MiB`, `[]`, `4`,
    `2.5`, `127.0.0.1`; NOT_PARSED for prose."""
    text = without_parentheses(text).strip().strip("`").strip()
    if text in ("unset", "none"):
        return None
    if text in ("off", "on"):
        return text == "on"
    if text == "required":
        return REQUIRED
    if match := re.fullmatch(r"(\d+(?:\.\d+)?) ?(ms|s|min|m|h)", text):
        return timedelta(**{DURATION_UNITS[match.group(2)]: float(match.group(1))})
    if match := re.fullmatch(r"(\d+) ?(KiB|MiB|GiB)", text):
        return int(match.group(1)) * 1024 ** (["KiB", "MiB", "GiB"].index(match.group(2)) + 1)
    if text == "[]":
        return []
    if re.fullmatch(r"\d+", text):
        return int(text)
    if re.fullmatch(r"\d+\.\d+", text):
        return float(text)
    if re.fullmatch(r"[\w.:/-]+", text):
        return text
    return NOT_PARSED


def _same_default(documented: Any, field: Any) -> bool:
    if documented is REQUIRED:
        return field.is_required()
    if field.is_required():
        return False
    actual = field.get_default(call_default_factory=True)
    actual = getattr(actual, "value", actual)  # an enum member
    if isinstance(actual, timedelta) and isinstance(documented, int | float) and not isinstance(documented, bool):
        return actual.total_seconds() == documented
    if isinstance(actual, Path):
        actual = str(actual)
    return documented == actual


def _env_names(cls: Any) -> dict[str, str]:
    prefix = cls.model_config["env_prefix"]
    return {prefix + name.upper(): name for name in cls.model_fields}


def _resolve_setting(name: str, classes: dict[str, Any], after: str | None = None) -> tuple[Any, str] | None:
    """(settings class, field) a table's name means: a full name, or `…_X` / `_X` as the one name of the class
    of the full name `after` (the one before it in the cell) that ends so."""
    if name.startswith("LIFELINE_"):
        prefix = next((p for p in classes if name.startswith(p)), None)
        if prefix is None:
            return None
        field = _env_names(classes[prefix]).get(name)
        return (classes[prefix], field) if field else None
    context = _resolve_setting(after, classes) if after else None
    if context is None:
        return None
    suffix = name.lstrip("…")
    matching = [(context[0], f) for env, f in _env_names(context[0]).items() if env.endswith(suffix)]
    return matching[0] if len(matching) == 1 else None


@dataclass(frozen=True)
class SettingRow:
    passage: Passage
    name: str
    resolved: tuple[Any, str] | None  # (settings class, field); None: no field has that name
    default: Any  # NOT_PARSED where the cell is prose


def settings_rows(page: Path) -> Iterator[SettingRow]:
    """Each variable of each table with a `default` column whose rows name `LIFELINE_<PROCESS>_…` variables."""
    classes = settings_classes()
    header: list[str] | None = None
    for passage in passages(page):
        if not passage.text.startswith("|"):
            header = None
            continue
        cells = table_cells(passage.text)
        if passage.starts_table:
            header = [c.lower() for c in cells]
            continue
        if header is None or set(passage.text) <= set("|-: ") or "default" not in header:
            continue
        default_cell = cells[header.index("default")] if len(cells) > header.index("default") else ""
        names_cell = next((c for c in cells if re.search(r"`(?:LIFELINE_[A-Z0-9_]+|…?_[A-Z0-9_]+)`", c)), None)
        if names_cell is None:
            continue
        names = re.findall(r"`(LIFELINE_[A-Z0-9_]*[A-Z0-9]|…?_[A-Z0-9_]*[A-Z0-9])`", names_cell)
        last = None
        named: list[tuple[str, str | None]] = []  # (name, the full name before it)
        for name in names:
            if name.startswith("LIFELINE_"):
                last = name
                named.append((name, None))
            elif last is not None:
                named.append((name, last))
        if not any(n.startswith(tuple(classes)) for n, _ in named):
            continue  # a table of other variables (a test's, a tool's)
        parts = [p for p in re.split(r",\s+|\s+/\s+", without_parentheses(default_cell).strip()) if p]
        defaults = [_default(p) for p in parts] if len(parts) == len(named) else [NOT_PARSED] * len(named)
        for (name, after), default in zip(named, defaults, strict=True):
            yield SettingRow(passage, name, _resolve_setting(name, classes, after), default)


def test_every_settings_table_gives_fields_and_their_defaults() -> None:
    unknown, wrong = [], []
    for page in pages():
        for row in settings_rows(page):
            if row.resolved is None:
                unknown.append(f"{row.passage.where()}: `{row.name}`")
                continue
            cls, field = row.resolved
            if row.default is NOT_PARSED:
                continue
            if not _same_default(row.default, cls.model_fields[field]):
                actual = cls.model_fields[field]
                code = "required" if actual.is_required() else repr(actual.get_default(call_default_factory=True))
                wrong.append(f"{row.passage.where()}: `{row.name}` documented {row.default!r}, "
                             f"{cls.__name__}.{field} is {code}")
    assert not unknown, "settings tables name variables no settings class reads:\n" + "\n".join(unknown)
    assert not wrong, "settings tables give other defaults than the code:\n" + "\n".join(wrong)


def test_the_controlplane_settings_table_lists_every_setting() -> None:
    """docs/controlplane.md's table is the whole of ControlPlaneSettings, both ways."""
    from controlplane.config import ControlPlaneSettings

    page = ROOT / "docs" / "controlplane.md"
    rows = [r for r in settings_rows(page) if r.resolved is None or r.resolved[0] is ControlPlaneSettings]
    assert len(rows) > 10, "docs/controlplane.md has no `| setting | default | meaning |` table"
    unknown = [f"{r.passage.where()}: `{r.name}`" for r in rows if r.resolved is None]
    assert not unknown, "docs/controlplane.md's settings table names settings ControlPlaneSettings lacks:\n" + \
        "\n".join(unknown)
    documented = {r.resolved[1] for r in rows if r.resolved}
    prefix = ControlPlaneSettings.model_config["env_prefix"]
    missing = [f"{prefix}{f.upper()}" for f in ControlPlaneSettings.model_fields if f not in documented]
    assert not missing, "ControlPlaneSettings has settings docs/controlplane.md's table does not list:\n" + \
        "\n".join(missing)


def test_the_default_parser_reads_each_form() -> None:
    assert [_default(t) for t in ("unset", "`5s`", "2 min", "8 MiB", "`[]`", "`4`", "2.5", "off", "`127.0.0.1`",
                                  "SQLite file `x` in the data dir", "5 s (durations as ISO 8601)")] == [
        None, timedelta(seconds=5), timedelta(minutes=2), 8 << 20, [], 4, 2.5, False, "127.0.0.1", NOT_PARSED,
        timedelta(seconds=5)]


def settings_classes() -> dict[str, Any]:
    """Each process's settings class by its environment prefix, longest first."""
    from controlplane.config import ControlPlaneSettings
    from controlplane.replication.config import ReplicationSettings
    from engine.settings import EngineSettings, FaultSettings
    from gateway.settings import GatewaySettings
    from holder.settings import HolderSettings
    from warm_pool.settings import AgentSettings

    classes = [ControlPlaneSettings, ReplicationSettings, EngineSettings, FaultSettings, GatewaySettings,
               HolderSettings, AgentSettings]
    by_prefix = {cls.model_config["env_prefix"]: cls for cls in classes}
    return dict(sorted(by_prefix.items(), key=lambda item: -len(item[0])))


def _field_of(cls: Any, name: str, delimiter: str | None) -> bool:
    """Whether `name` (the variable without its prefix) reads a field of `cls`, nested ones with `delimiter`."""
    parts = name.lower().split(delimiter) if delimiter else [name.lower()]
    model = cls
    for part in parts:
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        annotation = fields[part].annotation
        model = next((a for a in (annotation, *getattr(annotation, "__args__", ())) if hasattr(a, "model_fields")),
                     None)
    return True


def test_every_process_setting_a_page_names_is_a_field() -> None:
    classes = settings_classes()
    variable = re.compile(r"(?<![A-Z0-9_])(LIFELINE_(?:" + "|".join(
        re.escape(p.removeprefix("LIFELINE_").rstrip("_")) for p in classes) + r")_[A-Z0-9_]*[A-Z0-9])(?![A-Z0-9_])")
    unknown = []
    for page in pages():
        for passage in passages(page):
            for name in variable.findall(passage.text):
                prefix = next(p for p in classes if name.startswith(p))
                cls = classes[prefix]
                if not _field_of(cls, name.removeprefix(prefix), cls.model_config.get("env_nested_delimiter")):
                    unknown.append(f"{passage.where()}: `{name}` ({cls.__name__} has no such field)")
    assert not unknown, "the docs name settings no settings class reads:\n" + "\n".join(unknown)


# The gateway's configuration block: every key a GatewaySettings field, every value its default but these examples.
GATEWAY_EXAMPLE_VALUES = {"replica_id", "region", "models", "registry.token"}


def _walk_configuration(model: Any, block: dict[str, Any], path: str = "") -> Iterator[str]:
    from pydantic import BaseModel

    for key, value in block.items():
        field = model.model_fields.get(key)
        if field is None:
            yield f"`{path}{key}`: {model.__name__} has no such field"
            continue
        if isinstance(value, dict):
            annotation = field.annotation
            nested = next((a for a in (annotation, *getattr(annotation, "__args__", ()))
                           if isinstance(a, type) and issubclass(a, BaseModel)), None)
            if nested is None:
                yield f"`{path}{key}` is no section in {model.__name__}"
            else:
                yield from _walk_configuration(nested, value, f"{path}{key}.")
        elif f"{path}{key}" not in GATEWAY_EXAMPLE_VALUES and not _same_default(value, field):
            yield f"`{path}{key}: {value}`, the default is {field.get_default(call_default_factory=True)!r}"


def test_the_gateway_configuration_block_is_gateway_settings_with_its_defaults() -> None:
    import yaml

    from gateway.settings import GatewaySettings

    page = ROOT / "docs" / "gateway.md"
    text = page.read_text()
    section = text[text.index("\n## Configuration\n"):]
    start = section.index("```yaml\n") + len("```yaml\n")
    block = yaml.safe_load(section[start:section.index("```", start)])
    assert isinstance(block, dict) and {"recovery", "admission", "registry"} <= set(block)
    wrong = list(_walk_configuration(GatewaySettings, block))
    assert not wrong, "docs/gateway.md's Configuration block differs from GatewaySettings:\n" + "\n".join(wrong)


# --- the snapshot's shape ---------------------------------------------------------------------------------------


def parse_shape(text: str) -> dict[str, Any]:
    """`{a, b: {c, d}, m: {name: {x}}}` → {"a": {}, "b": {"c": {}, "d": {}}, "m": {"name": {"x": {}}}}."""
    tokens = re.findall(r"[\w|*]+|[{}:,]", text)
    position = 0

    def shape() -> dict[str, Any]:
        nonlocal position
        assert tokens[position] == "{", tokens[position:]
        position += 1
        keys: dict[str, Any] = {}
        while tokens[position] != "}":
            key = tokens[position]
            position += 1
            keys[key] = {}
            if tokens[position] == ":":
                position += 1
                if tokens[position] == "{":
                    keys[key] = shape()
                else:
                    position += 1  # a leaf's value placeholder (`weight`)
            if tokens[position] == ",":
                position += 1
        position += 1
        return keys

    return shape()


def test_the_snapshot_shape_docs_controlplane_gives_is_routing_snapshot() -> None:
    from contract.snapshot import AliasEntry, RoutingSnapshot, VersionEntry

    page = ROOT / "docs" / "controlplane.md"
    text = " ".join(p.text for p in passages(page) if p.section == "Snapshot")
    found = re.search(r"`(\{schema_version.*?\})` with `ETag", text)
    assert found, "docs/controlplane.md's Snapshot section no longer shows the snapshot's shape"
    shape = parse_shape(found.group(1))
    [model] = shape["models"].values()
    [version] = model["versions"].values()
    [alias] = model["aliases"].values()
    for documented, record in ((shape, RoutingSnapshot), (version, VersionEntry), (alias, AliasEntry)):
        assert set(documented) == set(record.model_fields), (
            f"docs/controlplane.md's Snapshot shape of {record.__name__}: documents {sorted(documented)}, "
            f"the record has {sorted(record.model_fields)}")
