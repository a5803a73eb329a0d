"""Retrying transient failures without charging the server twice for one call.

A failure is transient when the server was not reached or said "try again":
connection refused or reset, 429, 502, 503 and 504. Timeouts are not retried
(the server may still be working on the call), and other 4xx/5xx errors surface
unchanged as openai's own exceptions.

The caller tags a call once, before the first attempt, so every attempt carries
the same call id. openai's own retry loop is switched off for these requests
(`max_retries=0` per request) so retries are never stacked.

Cost: building a tenacity controller takes about 30 microseconds, more than the
SDK's whole per-call budget, so the caller makes the first attempt itself and
tenacity only takes over after a transient failure.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import openai
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

log = logging.getLogger("autellix")

T = TypeVar("T")

TRANSIENT_STATUS_CODES = frozenset({429, 502, 503, 504})


def is_transient(error: BaseException) -> bool:
    """Whether `error` is worth another attempt with the same call id."""
    if isinstance(error, openai.APITimeoutError):
        return False
    if isinstance(error, openai.APIConnectionError):
        return True
    return isinstance(error, openai.APIStatusError) and error.status_code in TRANSIENT_STATUS_CODES


def worth_retrying(first_failure: BaseException, attempts: int) -> bool:
    """Whether a call whose first attempt failed so should get its other attempts."""
    return attempts > 1 and is_transient(first_failure)


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often transient failures are retried.

    The number of attempts is not part of the policy: it comes from the client's
    `max_retries` (attempts = max_retries + 1), as in the plain openai client.
    Waits grow exponentially from `backoff_seconds` with full jitter, never exceed
    `max_backoff_seconds`, and honour a numeric `Retry-After` up to that cap.
    No new attempt starts after `max_seconds` from the first retry.
    """

    max_seconds: float = 30.0
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 8.0

    async def retry_async(
        self, send: Callable[[], Awaitable[T]], first_failure: Exception, *, attempts: int
    ) -> T:
        """Retry `send()` after its first attempt failed with the transient `first_failure`.

        `attempts` counts all attempts, the failed first one included.
        """
        replay = _replay_first_failure(first_failure, send)

        async def attempt() -> T:  # tenacity awaits only coroutine functions
            return await replay()

        return await AsyncRetrying(**self._tenacity_options(attempts))(attempt)

    def retry_blocking(
        self, send: Callable[[], T], first_failure: Exception, *, attempts: int
    ) -> T:
        """The blocking twin of `retry_async`."""
        return Retrying(**self._tenacity_options(attempts))(
            _replay_first_failure(first_failure, send)
        )

    def _tenacity_options(self, attempts: int) -> dict[str, Any]:
        backoff = wait_random_exponential(
            multiplier=self.backoff_seconds, max=self.max_backoff_seconds
        )

        def wait(state: RetryCallState) -> float:
            return max(backoff(state), self._retry_after_seconds(state))

        return {
            "stop": stop_after_attempt(attempts) | stop_after_delay(self.max_seconds),
            "wait": wait,
            "retry": retry_if_exception(is_transient),
            "before_sleep": _log_retry,
            "reraise": True,
        }

    def _retry_after_seconds(self, state: RetryCallState) -> float:
        """The server's numeric Retry-After for the last failure, capped; 0 if none."""
        error = state.outcome.exception() if state.outcome else None
        if not isinstance(error, openai.APIStatusError):
            return 0.0
        try:
            seconds = float(error.response.headers.get("retry-after", 0))
        except ValueError:  # an HTTP date: not worth parsing for a capped wait
            return 0.0
        return min(max(seconds, 0.0), self.max_backoff_seconds)


def _replay_first_failure(first_failure: Exception, send: Callable[[], T]) -> Callable[[], T]:
    """`send`, except that the first call raises `first_failure` again.

    Tenacity then counts the failure the caller already saw as its first attempt.
    """
    pending: list[Exception] = [first_failure]

    def attempt() -> T:
        if pending:
            raise pending.pop()
        return send()

    return attempt


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    log.info(
        "autellix: attempt %d failed (%s); retrying in %.2f s",
        state.attempt_number,
        error,
        state.upcoming_sleep,
    )
