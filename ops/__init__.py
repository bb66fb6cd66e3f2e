"""ops app: operator tooling over every database (reconciler, revoke, fence repair)."""
