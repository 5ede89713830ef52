"""Fetching each replica's PoL manifest, and who is to blame when that fails (issue 8 finding 9).

Noise authenticates every byte, so what a provider *answered* (no manifest, not found, wrong bytes) is
its own doing and a fault. A missing answer (timeout, busy, refused, unreachable) may be a third party's
flood or the verifier's own network: it never becomes a fault at once. The verifier abstains (signs no
verdict; the job is retried with backoff) until the provider has served nothing for a whole grace
window while the verifier did reach another provider of the unit. docs/ARCHITECTURE.md ("Errors say who
is to blame") has the table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from veritrain.agentkit import BlobPlane, UnitManifest, unhex32
from veritrain.errors import AgentError, FetchIncomplete, P2PError, RequestDenied, VeritrainError

if TYPE_CHECKING:
    from verifier.core import Submission
    from veritrain.messages import VerificationJobView
    from veritrain.pol import Transcript

UNREACHABLE_GRACE_S = 600.0


class VerificationDeferred(AgentError):
    """The verifier abstains for now: a fetch failed for a reason that may not be the provider's."""


@dataclass
class Blame:
    """Remembers since when each (job, provider) gave no answer, to tell a flood from a silent provider."""

    grace_s: float = UNREACHABLE_GRACE_S
    clock: Callable[[], float] = time.monotonic
    _silent_since: dict[tuple[int, str], float] = field(default_factory=dict)

    def problems(self, job_id: int, failures: dict[str, VeritrainError], reached_any: bool) -> dict[str, str]:
        """The fault reason per failed provider; VerificationDeferred if any failure is not yet a fault."""
        now = self.clock()
        problems: dict[str, str] = {}
        deferred: list[str] = []
        for provider, err in failures.items():
            if isinstance(err, FetchIncomplete | RequestDenied):
                since = self._silent_since.setdefault((job_id, provider), now)
                if reached_any and now - since >= self.grace_s:
                    problems[provider] = f"served nothing for {now - since:.0f}s: {err}"
                else:
                    deferred.append(f"{provider}: {type(err).__name__}: {err}")
            elif isinstance(err, P2PError):  # a protocol mismatch or the verifier's own node
                deferred.append(f"{provider}: {type(err).__name__}: {err}")
            else:  # the provider's own answer: no manifest, not found, wrong bytes, broken framing
                problems[provider] = f"PoL manifest unavailable: {err}"
        if deferred:
            raise VerificationDeferred(f"job {job_id}: abstaining, no answer from " + "; ".join(deferred))
        return problems


def collect_submissions(
    blobs: BlobPlane,
    job: VerificationJobView,
    blame: Blame,
    evidence: Callable[[str, Transcript], Any],
) -> list[Submission]:
    """One core Submission per replica, in assignment order; raises VerificationDeferred to abstain."""
    from verifier.core import Submission
    from veritrain.pol import Transcript

    fetched: dict[str, tuple[UnitManifest, Transcript]] = {}
    failures: dict[str, VeritrainError] = {}
    for replica in job.replicas:
        if replica.result_digest is None:
            continue
        try:
            manifest_digest = blobs.lookup_manifest(replica.p2p_addr, replica.result_digest)
            manifest = UnitManifest.from_bytes(blobs.fetch(replica.p2p_addr, manifest_digest))
            fetched[replica.provider] = (manifest, Transcript.from_json(manifest.transcript))
        except VeritrainError as err:
            failures[replica.provider] = err
    problems = blame.problems(job.job_id, failures, reached_any=bool(fetched))
    result: list[Submission] = []
    for replica in job.replicas:
        if replica.result_digest is None:
            result.append(Submission(provider=replica.provider, problem="no result revealed"))
        elif replica.provider in problems:
            result.append(Submission(provider=replica.provider, problem=problems[replica.provider]))
        elif fetched[replica.provider][0].result_digest != replica.result_digest:
            problem = "served manifest does not belong to the revealed result"
            result.append(Submission(provider=replica.provider, problem=problem))
        else:
            transcript = fetched[replica.provider][1]
            result.append(
                Submission(
                    provider=replica.provider,
                    result_digest=unhex32(replica.result_digest),
                    transcript=transcript,
                    evidence=evidence(replica.p2p_addr, transcript),
                    fold=fetched[replica.provider][0].fold(),
                )
            )
    return result
