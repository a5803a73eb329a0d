"""Drop-in openai clients whose calls carry the caller's program and thread identity.

The hook is `request(cast_to, options, ...)`: every HTTP call an openai client
makes (`chat.completions.create`, `completions.create`, `responses.create`, their
streaming forms, `with_raw_response`, low-level `post`) goes through it. Our
override does two things and then hands over to openai unchanged:

1. tag: read the current identity from the contextvar and add headers and
   `vllm_xargs` to a copy of the request options (see `_tagging`);
2. retry: run openai's request with its own retries off, retrying transient
   failures with one call id (see `_retry`).

Reading the identity at call time (not storing it on the client) is what keeps
`with_options()` copies and shared module-level clients correct.
"""

from __future__ import annotations

import weakref
from typing import Any, Self

import openai

from ._identity import current_identity, new_id
from ._retry import RetryPolicy
from ._tagging import tagging_update

_newest_clients: dict[str, weakref.ref[Any]] = {}
"""The most recently constructed autellix client of each kind ("async", "sync")."""


def newest_async_client() -> AsyncOpenAI | None:
    """The newest `autellix.AsyncOpenAI` still alive: where `@program` opens async programs."""
    ref = _newest_clients.get("async")
    return ref() if ref else None


def newest_sync_client() -> OpenAI | None:
    """The newest `autellix.OpenAI` still alive: where `@program` opens sync programs."""
    ref = _newest_clients.get("sync")
    return ref() if ref else None


class _AutellixClientMixin:
    """What `AsyncOpenAI` and `OpenAI` share: settings, copies, tagging a call."""

    max_retries: int
    _retry_policy: RetryPolicy

    def __init__(
        self,
        *,
        retry_max_seconds: float = RetryPolicy.max_seconds,
        retry_backoff_seconds: float = RetryPolicy.backoff_seconds,
        _autellix_copy: bool = False,
        **openai_options: Any,
    ) -> None:
        super().__init__(**openai_options)
        self._retry_policy = RetryPolicy(
            max_seconds=retry_max_seconds, backoff_seconds=retry_backoff_seconds
        )
        # Copies from with_options() are often short-lived temporaries; only
        # clients the user constructed become the default for new programs.
        if not _autellix_copy:
            kind = "async" if isinstance(self, openai.AsyncOpenAI) else "sync"
            _newest_clients[kind] = weakref.ref(self)

    def copy(
        self,
        *,
        retry_max_seconds: float | None = None,
        retry_backoff_seconds: float | None = None,
        **openai_overrides: Any,
    ) -> Self:
        """openai's `copy`/`with_options`, also accepting and keeping the retry settings."""
        policy = self._retry_policy
        extra_kwargs = {
            **openai_overrides.pop("_extra_kwargs", {}),
            "retry_max_seconds": _given_or(retry_max_seconds, policy.max_seconds),
            "retry_backoff_seconds": _given_or(retry_backoff_seconds, policy.backoff_seconds),
            "_autellix_copy": True,
        }
        return super().copy(**openai_overrides, _extra_kwargs=extra_kwargs)  # type: ignore[misc]

    with_options = copy

    def _prepare_call(self, options: Any) -> tuple[Any, int]:
        """A tagged copy of openai's request options, and how many attempts the call gets."""
        attempts = options.get_max_retries(self.max_retries) + 1
        update: dict[str, Any] = {"max_retries": 0}  # we retry; openai must not retry again
        identity = current_identity()
        if identity is not None:
            update.update(tagging_update(options, identity, call_id=new_id()))
        return options.model_copy(update=update), attempts


def _given_or(value: float | None, default: float) -> float:
    return default if value is None else value


class AsyncOpenAI(_AutellixClientMixin, openai.AsyncOpenAI):
    """`openai.AsyncOpenAI` whose calls carry the autellix program and thread identity.

    Takes every argument `openai.AsyncOpenAI` takes, plus:

    - `retry_max_seconds`: no retry starts later than this after a call's first
      failure (default 30);
    - `retry_backoff_seconds`: the first backoff; later ones double, with jitter
      (default 0.5).

    `max_retries` keeps its openai meaning (default 2): a call gets
    `max_retries + 1` attempts, all with the same call id.
    """

    async def request(self, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        options, attempts = self._prepare_call(options)
        send = super().request
        return await self._retry_policy.call_async(
            lambda: send(cast_to, options, *args, **kwargs), attempts=attempts
        )


class OpenAI(_AutellixClientMixin, openai.OpenAI):
    """`openai.OpenAI` whose calls carry the autellix program and thread identity.

    Same extra arguments as `autellix.AsyncOpenAI`.
    """

    def request(self, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        options, attempts = self._prepare_call(options)
        send = super().request
        return self._retry_policy.call_blocking(
            lambda: send(cast_to, options, *args, **kwargs), attempts=attempts
        )
