"""The one interface through which fault injection reaches the engine.

The scheduler and the serving layer call these hooks at fixed points and
never read fault settings themselves; `NoFaults` is what a production engine
runs, `engine.faults.FaultInjector` is the test and drill implementation.

    scheduler:  first_token_delay_s()  when a sequence is submitted
                token_delay_s()        after each token is sampled
                before_step()          on the decode thread before each step (may block: a stalled step)
    serving:    admit_request()        before a request is accepted (may raise)
                before_send()          before each token leaves (may exit or hang)
                after_send(count)      once tokens were handed to the socket
"""

from __future__ import annotations

from typing import Protocol


class EngineHooks(Protocol):
    def first_token_delay_s(self) -> float: ...

    def token_delay_s(self) -> float: ...

    def before_step(self) -> None:
        """Runs on the decode thread inside the step the watchdog times; blocking here stalls the loop."""
        ...

    def admit_request(self) -> None:
        """Raise an `EngineError` to refuse the request."""
        ...

    async def before_send(self) -> None: ...

    def after_send(self, count: int) -> None: ...


class NoFaults:
    """Hooks that do nothing: the engine as it runs in production."""

    def first_token_delay_s(self) -> float:
        return 0.0

    def token_delay_s(self) -> float:
        return 0.0

    def before_step(self) -> None:
        return None

    def admit_request(self) -> None:
        return None

    async def before_send(self) -> None:
        return None

    def after_send(self, count: int) -> None:
        return None
