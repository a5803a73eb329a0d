"""Letting a call in: its program (named by the client, or derived), its owner,
and what an engine is told of the program's service.

Plain Python, shared by the two fronts that keep the global process table: the
router's dispatcher (``dispatch``) and the Ray Serve directory
(``autellix_vllm.ray_serve.directory``), so that a call is admitted by the
same rules on either path:

* a call that names its program is counted in the table, which may refuse it
  (ended, another key's, limits, a reused call id);
* a call that names none gets the program ``derived`` names from what its
  client sent, if anything; a derived program the table refuses (it is full)
  runs the call without a program, since the client asked for none;
* the call runs under its program's owner (the key that opened it), else its
  caller's: that is whose fair share of service and of held KV it draws on,
  on the engine;
* the call's band is the one it asked for, never better than its caller's key
  allows (``Client.band_for``), and the table notes it as its program's class;
* the call carries its owner's weight (the weight of the key that opened the
  program, ``ProgramRecord.weight``, else its caller's), which sizes the owner's
  share of service on the engine;
* an engine is told the program's service over all engines only if it counts
  service in tokens as the table does (:func:`states_prior_service`), at most
  ``ProgramLimits.max_prior_service`` (:func:`prior_service`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from autellix_vllm.policy.config import ProgramLimits, ServiceMeter
from autellix_vllm.protocol.identity import CallIdentity
from autellix_vllm.protocol.paths import RESPONSES_PATH
from autellix_vllm.router.derived import ProgramDeriver
from autellix_vllm.router.keys import Client
from autellix_vllm.router.programs import (
    ProgramLimitExceeded,
    ProgramRecord,
    ProgramTable,
    TooManyPrograms,
)

log = logging.getLogger("autellix.router")

# The unit the table sums service in: the default meter's, as the fronts meter usage.
TABLE_SERVICE_UNIT = ServiceMeter().unit


@dataclass(frozen=True)
class Admitted:
    """A call the table let in.

    ``record``: its program's (None: the call runs without a program).
    ``identity``: what the engine is told: the client's, with the derived
    program id if one was derived, the owner the call runs under, its band
    and the owner's weight (band 0 and weight 1, the defaults, go unstated).
    """

    record: ProgramRecord | None
    identity: CallIdentity


def admit(
    table: ProgramTable,
    deriver: ProgramDeriver | None,
    identity: CallIdentity,
    caller: Client,
    path: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
) -> Admitted:
    """Count a call of ``caller`` in ``table``, or raise the table's refusal.

    ``path``, ``body`` and ``headers`` (the call's) are read only for a call that
    names no program, to derive one.
    """
    # The band the call asked for, never better than its key allows.
    identity = replace(identity, priority=caller.band_for(identity.priority) or None)
    record: ProgramRecord | None = None
    if identity.program_id is not None:
        record = table.call_arrived(identity, caller)
    elif deriver is not None:
        derived = deriver.derive(path, body, headers, caller.owner)
        if derived is not None:
            named = replace(identity, program_id=derived.program_id)
            try:
                record = table.call_arrived(named, caller, name=derived.name)
            except (TooManyPrograms, ProgramLimitExceeded) as refusal:
                log.info("running a call without a program: %s", refusal)
                deriver.refused(derived)
            else:
                identity = named
                deriver.opened(derived, record)
    opener = caller if record is None else record  # whose share the call draws on
    stated_weight = None if opener.weight == 1.0 else opener.weight
    return Admitted(record, replace(identity, owner=opener.owner, weight=stated_weight))


def answered(
    deriver: ProgramDeriver | None,
    record: ProgramRecord,
    path: str,
    completed: bool,
    response_id: str | None,
) -> None:
    """What the deriver learns from a finished call of ``record``'s program: that
    it was active, and a completed response's id (a later ``previous_response_id``)."""
    if deriver is None:
        return
    deriver.touch(record)
    if path == RESPONSES_PATH and completed and response_id is not None:
        deriver.answered(record.program_id, record.owner, response_id)


def states_prior_service(service_unit: str | None) -> bool:
    """Whether an engine is told a program's prior service: one that counts service
    in the table's unit, or that keeps no table (None: it ignores the field)."""
    return service_unit in (None, TABLE_SERVICE_UNIT)


def prior_service(service: float, limits: ProgramLimits) -> float | None:
    """What an engine is told of a program's ``service`` over all engines (rounded,
    at most ``limits.max_prior_service``); None when it has none yet."""
    if service <= 0:
        return None
    return round(limits.bounded_prior_service(service), 3)
