"""Drop-in openai clients whose calls carry the caller's program and thread identity.

The hook is the client's public `post(path, *, cast_to, body, options, ...)`:
every LLM call (`chat.completions.create`, `completions.create`,
`responses.create`, their streaming forms, `with_raw_response`,
`with_streaming_response`) is a POST that goes through it, with its per-call
options as a plain `RequestOptions` dict. Our override does two things and then
hands over to openai unchanged:

1. tag: read the current identity from the contextvar (a task's first call
   starts its child thread, see `_identity`) and add the identity headers, and
   the retention hint if one is set (`_hints`), to a copy of the options (see
   `_tagging`); a call with no identity from an executor thread while a
   program is open is warned about once (`_threads`);
2. retry: run openai's POST with its own retries off, retrying transient
   failures with one call id (see `_retry`).

The first attempt is a direct call of openai's `post`: the SDK's budget is
50 microseconds per call, and a retry controller (or even one more coroutine
layer that every suspension resumes through) would spend part of it on calls
that never fail.

Other methods (GET, DELETE, ...) are left to openai, retries included.
Reading the identity at call time (not storing it on the client) is what keeps
`with_options()` copies and shared module-level clients correct.
"""

from __future__ import annotations

import weakref
from typing import Any, Self

import openai

from ._hints import current_priority, retention_ttl
from ._identity import current_identity, new_id, programs_open
from ._retry import RetryPolicy, worth_retrying
from ._tagging import tagged_headers
from ._threads import warn_if_lost_in_os_thread

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
    """What `AsyncOpenAI` and `OpenAI` share: settings, copies, tagging a POST."""

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
        # The openai client class this is mixed into defines `copy`.
        return super().copy(**openai_overrides, _extra_kwargs=extra_kwargs)  # type: ignore[misc]

    with_options = copy

    def _prepare_post(self, post_arguments: dict[str, Any]) -> int:
        """Tag a POST's options in `post_arguments`; return how many attempts it gets."""
        options = post_arguments.get("options") or {}
        attempts = options.get("max_retries", self.max_retries) + 1
        tagged = {**options, "max_retries": 0}  # we retry, openai must not
        identity = current_identity()
        if identity is not None:
            tagged["headers"] = tagged_headers(
                options.get("headers"), identity, new_id(), retention_ttl(), current_priority()
            )
        elif programs_open():
            warn_if_lost_in_os_thread()
        post_arguments["options"] = tagged
        return attempts


def _given_or(value: float | None, default: float) -> float:
    return default if value is None else value


class AsyncOpenAI(_AutellixClientMixin, openai.AsyncOpenAI):
    """`openai.AsyncOpenAI` whose calls carry the autellix program and thread identity.

    Takes every argument `openai.AsyncOpenAI` takes, plus:

    - `retry_max_seconds`: no retry starts later than this after a call's first
      failure (default 30);
    - `retry_backoff_seconds`: the first backoff; later ones double, with jitter
      (default 0.5).

    `max_retries` keeps its openai meaning (default 2): a POST gets
    `max_retries + 1` attempts, all with the same call id; other methods keep
    openai's own retries.
    """

    async def post(self, path: str, **post_arguments: Any) -> Any:
        attempts = self._prepare_post(post_arguments)
        send = super().post
        try:
            return await send(path, **post_arguments)
        except Exception as failure:
            if not worth_retrying(failure, attempts):
                raise
            first_failure = failure
        return await self._retry_policy.retry_async(
            lambda: send(path, **post_arguments), first_failure, attempts=attempts
        )


class OpenAI(_AutellixClientMixin, openai.OpenAI):
    """`openai.OpenAI` whose calls carry the autellix program and thread identity.

    Same extra arguments as `autellix.AsyncOpenAI`.
    """

    def post(self, path: str, **post_arguments: Any) -> Any:
        attempts = self._prepare_post(post_arguments)
        send = super().post
        try:
            return send(path, **post_arguments)
        except Exception as failure:
            if not worth_retrying(failure, attempts):
                raise
            first_failure = failure
        return self._retry_policy.retry_blocking(
            lambda: send(path, **post_arguments), first_failure, attempts=attempts
        )
