"""The API paths: the OpenAI generation endpoints, the router's program and engine
API, and each engine's own."""

from __future__ import annotations

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
RESPONSES_PATH = "/v1/responses"
# The calls that carry an identity: the OpenAI generation endpoints, the ones the
# SDK's OpenAI client makes and the router proxies and meters (it reads OpenAI's
# usage). The engine's middleware tags exactly these, so a call is scheduled as
# part of its program on the same endpoints whether it comes through the router
# or straight to an engine. vLLM's Anthropic ``/v1/messages`` is not among them.
GENERATION_PATHS = (CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, RESPONSES_PATH)

PROGRAMS_PATH = "/autellix/v1/programs"
"""Router: ``POST`` opens a program, ``GET`` is the global process table."""
PROGRAM_PATH = PROGRAMS_PATH + "/{program_id}"
"""Router: ``DELETE`` ends a program, there and on its engines."""
PROGRAM_TIMELINE_PATH = PROGRAM_PATH + "/timeline"
"""Router: ``GET`` a program's timeline (its calls' parts and its own time), for its owner."""
ENGINES_PATH = "/autellix/v1/engines"
"""Router: the engines, their health and load."""
ENGINE_TABLE_PATH = "/autellix/v1/engine/table"
"""Engine: its process table (``GET``; ``?summary=1``: without the programs' rows),
or the rows of some programs (``POST {"program_ids": [...]}``)."""
ENGINE_TABLE_MAX_IDS = 1000
"""Program ids one ``POST`` of :data:`ENGINE_TABLE_PATH` may name."""
ENGINE_PROGRAM_PATH = "/autellix/v1/engine/programs/{program_id}"
"""Engine: ``DELETE`` ends a program there."""
