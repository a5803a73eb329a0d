"""What the simulator replays: programs and their calls on an engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..policy import Call
from ..workloads.trace import CallSpec


@dataclass(eq=False)
class ProgramRun:
    """A program being replayed: what is done and what is left."""

    program_id: str
    arrival: float
    calls_left: int
    decode_total: int
    remaining_work: float  # decode tokens still to produce (the SRPT oracle's view)
    owner: str | None = None  # who runs it (None: the anonymous owner)
    priority: int | None = None  # its band (None: its owner's)
    end: float = 0.0
    done: set[str] = field(default_factory=set)


@dataclass(eq=False, slots=True)
class Job:
    """One call on one engine."""

    spec: CallSpec
    program: ProgramRun
    call: Call | None = None
    prompt: int = 0  # at least one token, as in vLLM
    computed: int = 0  # tokens whose KV exists (prefix hit + prefilled + decoded)
    decoded: int = 0
    hit_blocks: int = 0  # leading blocks shared with the context's cached prefix
    own_blocks: int = 0
    wait_since: float = 0.0
    wait_s: float = 0.0
    arrived_at: float = 0.0  # when it reached the router (its timeline's clock)
    scheduled_at: float | None = None  # when the engine first scheduled it
    first_token_at: float | None = None  # when its first token was sampled
    finished_at: float | None = None
    engine: str | None = None  # the engine that served it
    cached_tokens: int | None = None  # of its prompt, the prefix cache's on first admission
    ready_at: float = 0.0  # when its KV has loaded from the host tier
    context: str = ""  # the prefix cache's key: the program, or one of its subagents
    # The client's retention hint (``expect_tool``): seconds until the context's next
    # call, sent with this call; None: no hint, the residency estimates.
    retention_hint_s: float | None = None
    # Its band at the router's gate (None: no gate); 0 once it was held to the
    # starvation bound, which the engine is then told.
    band: int | None = None
    # Seconds the gate held it, when less than the bound (None: not held); the
    # engine is told, and ages it that much sooner (CallIdentity.router_wait_s).
    router_wait_s: float | None = None
    # The program id its client sends with it (empty: its program's); a client
    # that splits its program sends each call as a program of its own.
    sent_as: str = ""

    def __post_init__(self) -> None:
        self.prompt = max(self.spec.prompt_tokens, 1)
        self.sent_as = self.sent_as or self.program.program_id
        # The prefix cache is content-addressed, as vLLM's: a split call's prompt
        # still extends its agent's conversation.
        pid = self.program.program_id
        self.context = pid if self.spec.context is None else f"{pid}/{self.spec.context}"

    @property
    def missing(self) -> int:
        """Tokens without KV yet: the prompt and, once decoding, the last sampled
        token. After a preemption, everything again."""
        return self.prompt + self.decoded - self.computed

    @property
    def decode_left(self) -> int:
        return self.spec.decode_tokens - self.decoded
