"""A standby engine: a process that has already imported torch and the engine, waiting to be told what to serve.

Why it exists (measured, docs/benchmarks.md "Memory holder: restart-to-ready"):
with the holder, an engine SIGKILLed on these CPUs is back in ~3.3 s, and
~2.8 s of that is a new interpreter importing torch, FastAPI, uvicorn and the
engine (`python -X importtime`: torch alone ~2.0 s) — re-mapping the weights
takes 0.1 s. Whoever restarts engines (the bench, a test fleet, a pool driver)
keeps one `StandbyEngine` per host warm; on a crash it hands the standby the
`engine serve` arguments it would have exec'd, so the restart is
attach + re-map + self-test, and starts the next standby off the critical path.

A *primed* standby (`--prime-holder URL --prime-model DIR --prime-dtype D`,
given by a supervisor that knows which holder-backed engine it stands in
for) goes further while it waits: it reads the holder's sealed region and
boot epoch without attaching (`GET /v1/weights/snapshot`), maps the region
copy-on-write, pre-faults every page, builds the model over those views and
runs the self-test through a scheduler on them — all of what made the
`ready` phase of a restart (the self-test over freshly mapped pages: small
0.5 s p50, 1.6 s p99 under load) — and offers the result to the engine it
will become (`engine.runtime.offer_primed`). That engine still attaches
(the takeover, under its new boot generation) and uses the primed views
only if the holder describes the very region it primed: same holder boot,
same description, same file (`PrimedWeights.mismatch`); anything else is a
miss — it re-maps and self-tests as an unprimed one does, and says why. A
priming that fails (holder down, other model) leaves an unprimed standby.

The standby takes nothing before it is activated: no port, no boot
generation, no holder tenancy or lease (a primed one holds a read-only
mapping of the holder's pages, nothing the holder records). Activation runs the very
`engine serve` command (`engine.cli`), so the engine it becomes is the one a
cold start gives: a new boot generation, the lease path, the holder's
takeover or, with the holder gone, a load from disk that says so.

    supervisor                         standby process (`python -m engine.standby`)
    ──────────                         ───────────────
    StandbyEngine.spawn() ───────────► import engine.server, uvicorn's loops; warm torch's kernels
                                       primed: snapshot, map, pre-fault, model, self-test
                                       write the ready file; block on stdin (no CPU)
    engine dies (waitpid)
    activate(serve_args) ──stdin──────► one JSON line: `engine serve` arguments → serve
    (dead or stdin closed)             EOF on stdin (supervisor gone): exit 0, nothing served

The supervisor's side (`StandbyEngine`) lives in `contract/standby.py`, standard
library only, so a supervisor without torch (the pool driver, the bench) uses it
without importing the engine; it is re-exported here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from common.logs import get_logger
from contract.standby import StandbyEngine

if TYPE_CHECKING:
    from engine.runtime import PrimedWeights

__all__ = ["StandbyEngine", "main", "prime", "warm_up"]

log = get_logger(__name__)


def warm_up(torch_threads: int | None) -> None:
    """Import what `engine serve` imports, and run every kernel the decode loop uses once on a toy model.

    The first prefill in a fresh process costs ~40 ms more than the next
    (kernel dispatch caches); this moves it off the restart. Random weights,
    never a real model: the standby must not know or hold what it will serve.
    """
    import torch
    import uvicorn.lifespan.on  # noqa: F401 - uvicorn imports these in Config.load(), on the restart's path
    import uvicorn.loops.auto  # noqa: F401
    import uvicorn.protocols.http.auto  # noqa: F401
    import uvicorn.protocols.websockets.auto  # noqa: F401

    import engine.cli  # noqa: F401 - typer, the settings
    import engine.server  # noqa: F401 - FastAPI, the runtime, the model, the scheduler
    from engine.model import LlamaModel, LlamaShape

    if torch_threads:
        torch.set_num_threads(torch_threads)
    shape = LlamaShape(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                       max_positions=64, rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=2)
    kv = shape.num_kv_heads * shape.head_dim
    sizes = {"model.embed_tokens.weight": (64, 32), "lm_head.weight": (64, 32), "model.norm.weight": (32,),
             "model.layers.0.input_layernorm.weight": (32,), "model.layers.0.post_attention_layernorm.weight": (32,),
             "model.layers.0.self_attn.q_proj.weight": (32, 32), "model.layers.0.self_attn.k_proj.weight": (kv, 32),
             "model.layers.0.self_attn.v_proj.weight": (kv, 32), "model.layers.0.self_attn.o_proj.weight": (32, 32),
             "model.layers.0.mlp.gate_proj.weight": (48, 32), "model.layers.0.mlp.up_proj.weight": (48, 32),
             "model.layers.0.mlp.down_proj.weight": (32, 48)}
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float64, torch.float32):
        weights = {name: torch.randn(size, generator=generator, dtype=dtype) for name, size in sizes.items()}
        model = LlamaModel(shape, weights, dtype)
        cache = model.new_cache(16)
        model.prefill([3, 4, 5, 6], cache)
        model.decode([7], [cache])


def prime(holder_url: str, model_dir: Path, dtype: str, client: httpx.Client | None = None) -> PrimedWeights:
    """Map the holder's sealed weights, pre-fault them, build the model and self-test it: no tenancy, no lease.

    Raises `HolderUnavailable` (holder down, not ready, weights for another
    config or dtype); on that or any other failure the standby stays unprimed.
    """
    import torch
    from tokenizers import Tokenizer

    from engine.holder_client import check_compatible, map_region_weights, weights_snapshot
    from engine.metrics import EngineMetrics
    from engine.model import LlamaModel
    from engine.runtime import PrimedWeights, self_test_tokens
    from engine.scheduler import Scheduler

    torch_dtype = torch.float64 if dtype == "float64" else torch.float32
    model_dir = model_dir.resolve()
    snapshot = weights_snapshot(holder_url, client)
    check_compatible(snapshot.weights, model_dir, torch_dtype)
    mapped = map_region_weights(snapshot.weights, prefault=True)
    model = LlamaModel.from_weights(model_dir, mapped.tensors, torch_dtype)
    scheduler = Scheduler(model, EngineMetrics(), max_num_seqs=1)
    scheduler.start()
    try:
        tokens = asyncio.run(self_test_tokens(Tokenizer.from_file(str(model_dir / "tokenizer.json")), scheduler))
    finally:
        scheduler.stop()
    return PrimedWeights(holder_url=holder_url, model_dir=model_dir, dtype=dtype, holder_epoch=snapshot.holder_epoch,
                         description=snapshot.weights, file_id=mapped.file_id, model=model, self_test_tokens=tokens)


def _prime_or_say_why(args: argparse.Namespace) -> str | None:
    """Prime as asked and offer it to the engine-to-be; the reason it is not primed, or None."""
    from engine.holder_client import HolderUnavailable
    from engine.runtime import offer_primed

    try:
        primed = prime(args.prime_holder, args.prime_model, args.prime_dtype)
    except HolderUnavailable as exc:
        log.warning("standby not primed", holder=args.prime_holder, reason=str(exc))
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - any failed priming leaves a standby that serves as an unprimed one
        log.exception("standby not primed", holder=args.prime_holder, reason=repr(exc))
        return repr(exc)
    offer_primed(primed)
    log.info("standby primed", holder=args.prime_holder, holder_epoch=primed.holder_epoch,
             region=primed.description.region.region_id, tokens=primed.self_test_tokens)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.standby", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ready-file", type=Path, required=True, help="written once the standby is warm")
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--prime-holder", default=None, help="holder URL to prime from (with --prime-model)")
    parser.add_argument("--prime-model", type=Path, default=None, help="model directory the engine will serve")
    parser.add_argument("--prime-dtype", choices=("float64", "float32"), default="float64")
    args = parser.parse_args(argv)
    if (args.prime_holder is None) != (args.prime_model is None):
        parser.error("--prime-holder and --prime-model go together")
    warm_up(args.torch_threads)
    readiness: dict = {"pid": os.getpid(), "primed": False, "prime_error": None}
    if args.prime_holder is not None:
        from common.logs import configure_logging

        configure_logging("info", component="engine-standby")
        readiness["prime_error"] = _prime_or_say_why(args)
        readiness["primed"] = readiness["prime_error"] is None
    tmp = args.ready_file.with_name(args.ready_file.name + ".tmp")
    tmp.write_text(json.dumps(readiness) + "\n")
    tmp.replace(args.ready_file)
    line = sys.stdin.readline()
    if not line:  # the supervisor retired us (or died): serve nothing
        return 0
    serve_args = json.loads(line)["serve_args"]
    sys.stdin.close()
    import click
    import typer

    from engine.cli import engine_app

    command = typer.main.get_command(engine_app)  # typer collapses a one-command app into that command
    args = ["serve", *serve_args] if isinstance(command, click.Group) else serve_args
    command.main(args, prog_name="lifeline engine serve")  # exits the process as `engine serve` would
    return 0


if __name__ == "__main__":
    sys.exit(main())
