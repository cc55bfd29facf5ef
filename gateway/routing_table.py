"""What the gateway may route to: alias → version → declared engines.

One interface, `RoutingTable`; `StaticRoutingTable` reads it from the config
file today, a control-plane snapshot implements the same methods later (and
keeps serving its last good snapshot while the control plane is away).
Liveness is not here: that is the lease registry's job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

from tokenizers import Tokenizer
from contract.sampling import Sampling

from gateway.errors import BadRequest
from gateway.settings import EngineConfig, ModelConfig


@dataclass(frozen=True)
class ModelVersion:
    alias: str
    version: str
    model_dir: Path
    declared_max_model_len: int | None = None

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))

    @cached_property
    def chat_template(self) -> str | None:
        path = self.model_dir / "tokenizer_config.json"
        return json.loads(path.read_text()).get("chat_template") if path.exists() else None

    @cached_property
    def max_model_len(self) -> int:
        if self.declared_max_model_len is not None:
            return self.declared_max_model_len
        return int(json.loads((self.model_dir / "config.json").read_text())["max_position_embeddings"])


@dataclass(frozen=True)
class DeclaredEngine:
    instance_id: str
    url: str
    version: str
    zone: str
    region: str
    sampling: str = Sampling.ENGINE_DEFAULT.value


class RoutingTable(Protocol):
    def resolve(self, name: str) -> ModelVersion:
        """The version a client's model name (alias or version) maps to; BadRequest if none."""
        ...

    def versions(self) -> list[ModelVersion]: ...

    def declared_engines(self, version: str) -> list[DeclaredEngine]: ...


@dataclass
class StaticRoutingTable:
    models: list[ModelConfig]
    engines: list[EngineConfig] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_name: dict[str, ModelVersion] = {}
        for m in self.models:
            mv = ModelVersion(m.alias, m.version, m.model_dir, m.max_model_len)
            self._by_name[m.alias] = mv
            self._by_name.setdefault(m.version, mv)

    def resolve(self, name: str) -> ModelVersion:
        try:
            return self._by_name[name]
        except KeyError:
            known = sorted({m.alias for m in self.models})
            raise BadRequest(f"model {name!r} does not exist; known models: {known}", param="model") from None

    def versions(self) -> list[ModelVersion]:
        return [self._by_name[m.alias] for m in self.models]

    def declared_engines(self, version: str) -> list[DeclaredEngine]:
        return [DeclaredEngine(e.instance_id, e.url, e.version, e.zone, e.region, e.sampling.value)
                for e in self.engines if e.version == version]


def route_request(table: RoutingTable, name: str, *, cohort: str | None, client_key: str | None) -> ModelVersion:
    """The version a new request goes to: the table's mesh split (`route`) where it has one, else `resolve`.

    Only new requests are split; a resumed or migrated stream keeps the version it started on.
    """
    route = getattr(table, "route", None)
    if route is None:
        return table.resolve(name)
    return route(name, cohort=cohort, client_key=client_key)
