"""The engine: virtual time, each rank's coroutine driven to its next wait (`core`, `rank_tasks`), what a
rank waits on (`waits`), transfers and link sharing (`transfers`), and the event log (`eventlog`)."""
