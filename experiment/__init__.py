"""The fencing experiment: the real system and a naive lease-only baseline, one fault schedule."""
