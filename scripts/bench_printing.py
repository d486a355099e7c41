"""What the benchmarks print: their tables, with quiet logs."""

from __future__ import annotations

import logging
import warnings


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def quiet() -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("py4j").setLevel(logging.ERROR)
    for name in ("dagster", "sessionize_assets"):
        logging.getLogger(name).setLevel(logging.WARNING)
