"""What every dlock role shares: errors, headers, logs, metrics, budgets and the lock client."""
