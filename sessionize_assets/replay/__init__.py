"""`sessionize replay`: the landing zone's new and changed batches through the project's own
Definitions, as the daemon would. `command` is the command, `driver` plays the daemon for a
batch, `results` reads what a run reported."""
