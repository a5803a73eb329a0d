"""Chat conversations shaped on public chat logs, most of them one turn (chat).

The shape follows the public logs of real users talking to chat models:

* LMSYS-Chat-1M (Zheng et al., ICLR 2024, arXiv 2309.11998): 1M conversations
  with 25 models, a mean of 2.0 turns; 69.5 tokens per user prompt and 214.5
  per response on average.
* WildChat (Zhao et al., ICLR 2024, arXiv 2405.01470): ChatGPT conversations,
  a mean of 2.52 turns; per turn 295.6 user tokens (standard deviation 1,609)
  and 441.3 response tokens (411). A public analysis of its 529,428-conversation
  release counts turns: mean 2.35, median 1; 42.1% of conversations have 2 or
  more, 26.2% 3 or more, 12.4% 5 or more, 2.7% 10 or more. The logs keep one
  timestamp per conversation, so no think times between turns.

A conversation has one turn with probability 0.66 (``ONE_TURN_SHARE``: "most
of these conversations have one turn", issue 39; WildChat has 58%, and
LMSYS-Chat-1M's lower mean more); otherwise two turns, each further one
following with chance 0.7 (a geometric tail through WildChat's multi-turn
shares), at most 50. That gives a mean of 2.15 turns, between the two logs,
with 23.9% of conversations at 3 turns or more, 11.8% at 5 or more and 2.1% at
10 or more. Per turn, the user's new tokens are log-normal through WildChat's
mean and deviation (median 53, sigma 1.85: most prompts are a line, a few paste
a document) and so is the model's output (median 323, sigma 0.79). Between
turns the user reads the answer and types the next message for a log-normal
time of median 30 s (sigma 1.0: 10% under 8 s, 10% over 108 s), at most 10
minutes: our assumption, as no log publishes one.

Each turn's prompt is the whole conversation so far plus the new message, as
a chat client sends it. A conversation ends after its drawn number of turns,
or before a turn that would not fit the model's context (``max_context``,
65,536 tokens by default; the user starts a new chat): no call's prompt and
output together pass it.
"""

from __future__ import annotations

import math
import random

from .sampling import geometric, lognormal_median
from .trace import CallSpec

CHAT_MAX_CONTEXT = 65_536

ONE_TURN_SHARE = 0.66
MORE_TURNS_MEAN = 7 / 3  # turns after the second: each further one follows with chance 0.7
TURNS_MAX = 50
USER_MEDIAN, USER_SIGMA = 53, 1.85  # new user tokens per turn
OUTPUT_MEDIAN, OUTPUT_SIGMA = 323, 0.79  # the model's answer
THINK_MEDIAN_S, THINK_SIGMA, THINK_MAX_S = 30.0, 1.0, 600.0


def _turns(rng: random.Random) -> int:
    if rng.random() < ONE_TURN_SHARE:
        return 1
    return min(TURNS_MAX, 2 + geometric(rng, MORE_TURNS_MEAN))


def _think_time(rng: random.Random) -> float:
    return min(THINK_MAX_S, rng.lognormvariate(math.log(THINK_MEDIAN_S), THINK_SIGMA))


def chat(rng: random.Random, pid: str, max_context: int = CHAT_MAX_CONTEXT) -> tuple[CallSpec, ...]:
    """One conversation: a chain of turns, each prompted with the conversation so far."""
    calls: list[CallSpec] = []
    history = 0
    for j in range(_turns(rng)):
        new = lognormal_median(rng, USER_MEDIAN, USER_SIGMA, 1, max_context)
        out = lognormal_median(rng, OUTPUT_MEDIAN, OUTPUT_SIGMA, 1, max_context)
        if j == 0:
            # The first turn always runs: a long paste is cut to what fits.
            out = min(out, max_context // 2)
            new = min(new, max_context - out)
        elif history + new + out > max_context:
            break
        calls.append(
            CallSpec(
                f"{pid}.t{j}", out, history + new,
                after=(calls[-1].id,) if calls else (), tool_gap=_think_time(rng) if j else 0.0,
            )
        )  # fmt: skip
        history += new + out
    return tuple(calls)
