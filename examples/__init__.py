"""Adopters' examples: services outside dlock's payouts, written against dlock's public APIs."""
