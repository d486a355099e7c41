"""A Spark failure that more memory, or fewer dates per run, would avoid, said as what to change.

Spark reports running out of room in its own words, far from the setting that decides it: an
`OutOfMemoryError` in a task, an operator refused memory (`UNABLE_TO_ACQUIRE_MEMORY`), "Not
enough memory to build and broadcast the table", a Spark Connect server that died of it
("Cannot call methods on a stopped SparkContext"), or a plan that Spark Connect's messages
cannot carry (a protobuf "Error parsing message", `RESOURCE_EXHAUSTED`). A lake step that
meets one fails with `capacity_failure`'s message instead: which step, over which dates, what
Spark said, and which setting to change. The original error stays chained below it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date

from dagster import Failure, MetadataValue

# What each kind of failure looks like in the error's text (a py4j error carries the Java
# stack trace, a Spark Connect one the server's message).
OUT_OF_MEMORY = (
    "java.lang.OutOfMemoryError",
    # Spark's own memory manager could not give a task's operator the room it asked for.
    "UNABLE_TO_ACQUIRE_MEMORY",
    "Not enough memory to build and broadcast",
    "GC overhead limit exceeded",
)
SERVER_GONE = ("Cannot call methods on a stopped SparkContext",)
PLAN_TOO_LARGE = (
    "Error parsing message with type 'spark.connect",
    "RESOURCE_EXHAUSTED",
    "Received message larger than max",
)
_SIGNS = (*OUT_OF_MEMORY, *SERVER_GONE, *PLAN_TOO_LARGE)


def capacity_failure(
    error: BaseException, *, step: str, dates: list[date], spark_config: Mapping[str, object]
) -> Failure | None:
    """A `dagster.Failure` saying what to change, when `error` is Spark running out of room
    (memory, or the size of a Spark Connect plan) in `step` over `dates`; None otherwise.

    `spark_config` is the run's Spark configuration: it says whether the memory that ran out
    is a local driver's (`SESSIONIZE_SPARK_CONF`'s `spark.driver.memory`), a Spark Connect
    server's (`SESSIONIZE_SPARK_SERVER_MEMORY`) or a cluster's executors'.
    """
    text = _chain_text(error)
    if any(sign in text for sign in PLAN_TOO_LARGE):
        what = "a query too large for Spark Connect's messages"
        change = [_fewer_dates(dates)]
    elif any(sign in text for sign in (*OUT_OF_MEMORY, *SERVER_GONE)):
        stopped = (
            "its Spark Connect server stopped"
            if spark_config.get("spark.remote")
            else "its Spark driver stopped"
        )
        what = "Spark ran out of memory" + (
            f" ({stopped})" if any(s in text for s in SERVER_GONE) else ""
        )
        change = [_more_memory(spark_config), _fewer_dates(dates)]
    else:
        return None
    span = f"{dates[0]}..{dates[-1]} ({len(dates)} dates)" if dates else "its partitions"
    description = (
        f"The {step} step over {span} failed: {what}. To change: "
        + "; or ".join(change)
        + ". Running it again as it is fails the same way."
    )
    return Failure(
        description=description,
        metadata={
            "step": step,
            "dates": len(dates),
            "what": what,
            "to change": MetadataValue.md("\n".join(f"- {c}" for c in change)),
            "spark said": _first_line(text),
        },
    )


def _more_memory(spark_config: Mapping[str, object]) -> str:
    if spark_config.get("spark.remote"):
        return (
            "give the Spark Connect server more memory (SESSIONIZE_SPARK_SERVER_MEMORY, "
            "then restart `sessionize dev` or `sessionize spark-server`)"
        )
    master = str(spark_config.get("spark.master", ""))
    if master.startswith("local"):
        current = spark_config.get("spark.driver.memory", "1g, Spark's default")
        return (
            f"give the Spark driver more memory (now {current}): "
            'SESSIONIZE_SPARK_CONF="spark.driver.memory=8g"'
        )
    return (
        "give the cluster's executors and the driver more memory "
        '(SESSIONIZE_SPARK_CONF="spark.executor.memory=...;spark.driver.memory=...")'
    )


def _fewer_dates(dates: list[date]) -> str:
    return (
        f"cover fewer dates per run (SESSIONIZE_MAX_PARTITIONS_PER_RUN, under {len(dates)}; "
        "for a backlog of landing folders, land fewer folders at once)"
    )


def _chain_text(error: BaseException) -> str:
    """The texts of `error` and the errors it was raised from or while handling, the first
    raised first: a step's cleanup that meets a Spark stopped by running out of memory raises
    "stopped SparkContext" over the `OutOfMemoryError` that stopped it."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return "\n".join(str(each) for each in reversed(chain))


def _first_line(text: str) -> str:
    """The error's line that names the failure (else its first), shortened for the UI."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if any(sign in line for sign in _SIGNS)]
    return (named or lines or [""])[0][:300]
