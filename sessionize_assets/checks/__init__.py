"""Asset checks: the SPEC's invariants on the Delta tables, scoped to what a run wrote."""

from sessionize_assets.checks.definitions import build_checks

__all__ = ["build_checks"]
