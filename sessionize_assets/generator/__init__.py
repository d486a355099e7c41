"""Deterministic generator of a realistic Segment-style landing zone (SPEC §1-§2).

Why: the pipeline must be exercised on data with the awkward parts of real event streams (late
mobile uploads, retries, bots, broken lines, mixed timestamp formats) while the outcome stays
known exactly, so tests, demos and benchmarks can check counts instead of eyeballing them.
Standard library only, so it runs anywhere without Spark or Dagster.

Parts: `population` (users), `activity` (when things happen), `content` (what messages say),
`invalid` (broken lines), `writer` (batch files) and `zone` (the day-by-day run and its report).
"""

from sessionize_assets.generator.zone import (
    LATE_SHAPES,
    REJECTION_REASONS,
    GenerationReport,
    ZoneSpec,
    append_day,
    generate_landing_zone,
)

__all__ = [
    "LATE_SHAPES",
    "REJECTION_REASONS",
    "GenerationReport",
    "ZoneSpec",
    "append_day",
    "generate_landing_zone",
]
