"""The market's lifecycles wired together over one store: the object the API, the Celery tasks and the
tests hold. It only composes; each lifecycle lives in its own module:

- ``agents`` (:mod:`market.registry`): registration, offers, heartbeats, the liveness sweep, chain facts.
- ``orders`` (:mod:`market.orders`): orders and their rounds and units, status.
- ``matching`` (:mod:`market.matchmaker`): the candidate pool and matching passes.
- ``assignments`` (:mod:`market.assignments`): accept, commit, reveal, the decision, unit outcomes.
- ``verification`` (:mod:`market.verification`): verifiers' jobs and signed verdicts.
- ``outbox`` (:mod:`market.outbox`): settlement intents sent to the chain.
- ``sync`` (:mod:`market.sync`): chain events applied to the market.
- ``progress`` (:mod:`market.progress`): providers' reported losses (the dashboard's live curve).
- ``custody`` (:mod:`market.custody`, kept by ``orders``): agents asked to keep live states beside their
  producers.
- ``canaries`` (:mod:`market.canary`): verified units replayed as known-answer canary orders.
- ``rosters`` (:mod:`market.rosters`) and ``roster_outbox`` (:mod:`market.roster_outbox`): the round path
  of an order that opts in (a roster per order, one step per round), its intents sent like the outbox's.
"""

from __future__ import annotations

from collections.abc import Callable

from market.assignments import Assignments
from market.canary import CanaryBook
from market.context import Lifecycle, MarketConfig, MarketContext, unix_now
from market.matchmaker import Matchmaker
from market.orders import OrderBook
from market.outbox import SettlementOutbox
from market.ports import CanaryAccount, RecipeCatalog, SettlementPort
from market.progress import ProgressReports
from market.registry import AgentRegistry
from market.roster_outbox import RosterOutbox
from market.rosters import RosterBook
from market.store import MarketStore
from market.sync import ChainSync
from market.verification import VerificationJobs


class MarketService(Lifecycle):
    def __init__(
        self,
        store: MarketStore,
        recipes: RecipeCatalog,
        chain: SettlementPort | None = None,
        config: MarketConfig | None = None,
        clock: Callable[[], int] = unix_now,
        canary: CanaryAccount | None = None,
    ) -> None:
        super().__init__(
            MarketContext(
                store,
                recipes,
                chain,
                config or MarketConfig(chain_id=chain.chain_id if chain else 31337),
                clock,
            )
        )
        self.matching = Matchmaker(self.ctx)
        self.rosters = RosterBook(self.ctx)
        self.roster_outbox = RosterOutbox(self.ctx, self.rosters)
        self.orders = OrderBook(self.ctx, self.rosters)
        self.custody = self.orders.custody
        self.assignments = Assignments(self.ctx, self.orders, self.matching)
        self.agents = AgentRegistry(self.ctx, self.matching, self.assignments)
        self.verification = VerificationJobs(self.ctx, self.orders)
        self.outbox = SettlementOutbox(self.ctx, self.assignments, self.agents)
        self.sync = ChainSync(self.ctx, self.assignments, self.agents, self.rosters)
        self.progress = ProgressReports(self.ctx)
        self.canaries = CanaryBook(self.ctx, self.orders, canary)
