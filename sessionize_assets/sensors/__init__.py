"""Sensors: the landing zone into the graph, and late data through it. One module a sensor:

- `landing`: new or changed batch folders -> ingest runs (compared with the lake's record of
  what was ingested, so it needs no cursor to be right).
- `late_data`: event dates whose partition has not absorbed the batches the lake's index says
  hold them -> events range runs (derived from the lake, so a failed or dead run leaves its
  dates to be asked for again).
- `stale_sessions`: session dates whose window holds events newer than what they absorbed, or
  materialized after them -> sessions range runs, as soon as an events run ends (automation's
  condition asks for the same dates a tick later, as a backfill, if nothing has taken them up:
  see `partitions.late_data_condition`); also a failed or dead run's dates, which automation
  does not ask for again.
- `lifecycle`: session dates materialized again, or new received days -> one snapshot run
  through the latest received day, which corrects every stale day in one go (automation would
  cascade one day per tick) and reports each day from the earliest of them, so that none is
  left unsynced in the UI.

What each asks the lake and the instance is in `behind` (`replay` and `rebuild` ask it too);
what they share of run requests and waiting for runs is in `requests`.
"""
