"""`python -m bench --only scale`: the scale curve (bench.configs)."""

from bench.configs import run_scale as run

__all__ = ["run"]
