"""Pure domain core of the market: state machines, matching, replication, rounds, pricing. No IO here."""
