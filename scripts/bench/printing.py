"""How the benchmarks print: their figures as Markdown tables, steps timed as they go, and
nothing else on the console (the libraries' warnings and logs would bury the tables)."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of `rows` under `header`, every cell right-aligned to its column."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A blank line, `title` (it may hold several lines), then the table."""
    print()
    print(title)
    print(table(header, rows))


@contextmanager
def timed(label: str) -> Iterator[None]:
    """Print `label` before the block and its wall time after it, as the run goes."""
    print(f"{label} ...", flush=True)
    started = time.perf_counter()
    yield
    print(f"  done in {time.perf_counter() - started:.1f}s", flush=True)


def quiet() -> None:
    """Silence warnings, py4j below errors and Dagster's and the package's logs below warnings."""
    warnings.filterwarnings("ignore")
    logging.getLogger("py4j").setLevel(logging.ERROR)
    for name in ("dagster", "sessionize_assets"):
        logging.getLogger(name).setLevel(logging.WARNING)
