"""Triggers: what starts runs without a client calling the API (docs/triggers.md).

* `timing.py`     a schedule's ticks (cron through cronsim, or an interval) and their jitter
* `schedules.py`  the workers' due pass over schedules, and trigger-now / backfill
* `expressions.py` CEL conditions and keys over an event (and a run, for waiting steps)
* `events.py`     receiving an event: stored once per id, the runs its triggers start
* `grouping.py`   debounce and batch groups, fired by the workers' due pass
* `hooks.py`      inbound webhooks: signature checks (GitHub, Stripe, HMAC) and replay protection
* `definitions.py` keeping a definition's `schedule` and `triggers` in step with its newest version
"""
