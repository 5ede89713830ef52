"""verifier."""
