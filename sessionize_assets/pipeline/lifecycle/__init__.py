"""sessions -> the user lifecycle: the intervals of the users a change touched, restated from
their earliest changed day, and the snapshot moved by what those intervals gained and lost.

What each table has absorbed is recorded in its own commits, as Delta `txn` actions
(`AppTransaction`, one per commit; `bookkeeping`), so a run that died between two
commits is completed by the next run, whatever range that one was asked for.

A run restates the users whose session days changed since that `sessions` version (from the
Delta log of `sessions`: the files added and removed since), the users with sessions on the
days the as-of day moves over, and the users whose current stretch runs out on those days
(`inactive` -> `dormant` -> `churned`). Everyone else keeps their rows. The snapshot then moves
by the interval rows added and removed since the version it reflects (from the Delta log of
`user_lifecycle_state`).

Where the work runs: a batch touches a few rows per touched user, so a run reads, restates and
commits them on the driver with Arrow (`touched`): a Spark job's fixed cost would be
most of the work. Restating every user (the first run, or when the `sessions` history since the
absorbed version is gone) runs the same rule on the executors, by Spark (`history`).
"""
