"""Reported training progress: providers sign the losses of the replica they are running, the market keeps
them for the dashboard's live loss curve. Only the provider holding a live replica of the unit may report
for it, and only steps inside the unit; the points are the provider's word until the unit is settled."""

from __future__ import annotations

from market.context import Lifecycle, row_id
from market.domain.states import ReplicaState
from veritrain.errors import InvalidInput, NotFound
from veritrain.messages import Progress, Signed, verify_signed

# Replicas whose reports are still shown: a fault, fraud or dropped replica's curve is not the order's.
REPORTING_STATES = frozenset(
    {
        ReplicaState.PROPOSED.value,
        ReplicaState.SIGNED.value,
        ReplicaState.COMMITTED.value,
        ReplicaState.REVEALED.value,
        ReplicaState.ACCEPTED.value,
    }
)


class ProgressReports(Lifecycle):
    def report(self, signed: Signed[Progress]) -> int:
        """Store a provider's signed loss points; returns how many the unit now holds from it."""
        message = verify_signed(signed, self.config.chain_id)
        now = self.clock()
        with self.store.transaction() as session:
            unit = self.store.get_unit(session, message.unit_id)
            replicas = {r.provider: r for r in self.ctx.live_replicas(session, unit)}
            replica = replicas.get(message.agent)
            if replica is None or replica.state not in REPORTING_STATES:
                raise NotFound(f"{message.agent} runs no replica of unit {message.unit_id}")
            beyond = [step for step in message.steps if step > unit.steps]
            if beyond:
                raise InvalidInput(f"steps {beyond} lie beyond unit {message.unit_id}'s {unit.steps} steps")
            self.ctx.accept_agent_message(session, message, now)
            self.store.add_loss_points(
                session,
                [
                    {
                        "unit_id": row_id(unit),
                        "provider": message.agent,
                        "step": step,
                        "loss_e6": loss,
                        "at": now,
                    }
                    for step, loss in zip(message.steps, message.losses_e6, strict=True)
                ],
            )
            return len(message.steps)
