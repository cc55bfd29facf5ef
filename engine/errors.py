"""Errors the engine returns, in the OpenAI shape clients already parse:
`{"error": {"message", "type", "param", "code"}}`.

Types keep vLLM's names (`BadRequestError`, …) so clients written for vLLM
branch the same way; `engine_draining` is Lifeline's own, shared with the
gateway through `contract.identity.DRAINING_ERROR_TYPE`.

    EngineError (500 InternalServerError)
    ├── BadRequest (400 BadRequestError)
    ├── NotFound (404 NotFoundError)
    ├── MethodNotAllowed (405 MethodNotAllowedError)
    ├── NotReady (503 ServiceUnavailableError): starting, partitioned, superseded, draining
    ├── EngineOverloaded (429 engine_overloaded): --max-waiting sequences already wait; carries Retry-After
    ├── EngineDraining (503 engine_draining): a request cut short by a planned shutdown
    ├── DecodeLoopStalled (503 decode_loop_stalled): /healthz/live while a step is over its bound
    ├── KVCheckpointRefused (400 kv_checkpoint_invalid): an import that is not a valid KV bundle
    ├── KVBlocksAbsent (404 kv_blocks_absent): nothing cached to export, or no prefix cache at all
    ├── KVValidityRefused (409 kv_validity_mismatch): blocks made under another validity tuple
    ├── KVImportTooLarge (413 kv_import_too_large): over --kv-import-max-bytes
    ├── KVCheckpointStoreAbsent (409 kv_checkpoint_store_absent): a checkpoint without --kv-checkpoint-store
    ├── KVStoreDown (503 kv_store_unavailable): the checkpoint store did not take a checkpoint
    └── InjectedFailure (500 InternalServerError): a fault drill
"""

from __future__ import annotations

from common.errors import LifelineError
from contract.identity import DRAINING_ERROR_TYPE


class EngineError(LifelineError):
    status_code = 500
    error_type = "InternalServerError"


class BadRequest(EngineError):
    status_code = 400
    error_type = "BadRequestError"


class NotReady(EngineError):
    status_code = 503
    error_type = "ServiceUnavailableError"


class InjectedFailure(EngineError):
    status_code = 500
    error_type = "InternalServerError"


class NotFound(EngineError):
    status_code = 404
    error_type = "NotFoundError"


class MethodNotAllowed(EngineError):
    status_code = 405
    error_type = "MethodNotAllowedError"


class EngineOverloaded(EngineError):
    """The waiting queue is full (`max_waiting`): refused before anything is queued, so memory stays bounded."""

    status_code = 429
    error_type = "engine_overloaded"


class EngineDraining(EngineError):
    status_code = 503
    error_type = DRAINING_ERROR_TYPE


class DecodeLoopStalled(EngineError):
    """`/healthz/live` while the decode loop is wedged (`engine.watchdog`): the process answers, it cannot generate."""

    status_code = 503
    error_type = "decode_loop_stalled"


class KVCheckpointRefused(EngineError):
    """An imported bundle that is malformed, breaks its hash chain or fails a checksum; nothing installed."""

    status_code = 400
    error_type = "kv_checkpoint_invalid"


class KVBlocksAbsent(EngineError):
    status_code = 404
    error_type = "kv_blocks_absent"


class KVValidityRefused(EngineError):
    """Blocks made under another weights version, tokenizer, dtype, block size or geometry: a miss, not used."""

    status_code = 409
    error_type = "kv_validity_mismatch"


class KVImportTooLarge(EngineError):
    status_code = 413
    error_type = "kv_import_too_large"


class KVCheckpointStoreAbsent(EngineError):
    """A checkpoint asked of an engine started without `--kv-checkpoint-store`."""

    status_code = 409
    error_type = "kv_checkpoint_store_absent"


class KVStoreDown(EngineError):
    """The checkpoint store did not answer; nothing is known to be stored, retry later."""

    status_code = 503
    error_type = "kv_store_unavailable"
