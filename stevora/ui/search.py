"""The runs list's search form: query parameters in, `RunFilters` and field problems out.

`q` is a run id or its beginning; `status` one of the run statuses; `definition` a definition
id; `from` / `to` a creation window (`2026-11-24T09:30` as a `datetime-local` input sends it,
read as UTC, or any ISO 8601 instant with an offset). A value that does not parse is dropped
and reported by field name, so the page still lists runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import urlencode

from stevora.db.reads.runs import RunFilters
from stevora.ui.queries import RUN_STATUSES

FILTER_KEYS = ("q", "status", "definition", "from", "to")


def _instant(raw: str) -> datetime:
    value = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def parse_run_filters(params: Mapping[str, str]) -> tuple[RunFilters, list[str]]:
    problems: list[str] = []
    status = (params.get("status") or "").strip().upper() or None
    if status is not None and status not in RUN_STATUSES:
        problems.append(f"status: must be one of {', '.join(RUN_STATUSES)}")
        status = None
    window: dict[str, datetime | None] = {"from": None, "to": None}
    for key in window:
        raw = (params.get(key) or "").strip()
        if raw:
            try:
                window[key] = _instant(raw)
            except ValueError:
                problems.append(f"{key}: not a date-time (use 2026-11-24T09:30)")
    run_id = (params.get("q") or "").strip() or None
    filters = RunFilters(
        run_id=run_id[:40] if run_id else None,
        status=status,
        definition_id=(params.get("definition") or "").strip() or None,
        created_from=window["from"],
        created_to=window["to"],
    )
    return filters, problems


def filter_query(params: Mapping[str, str]) -> str:
    """The search as a query string (without the page), for pager links and the live refresh."""
    return urlencode([(k, params[k]) for k in FILTER_KEYS if params.get(k)])


def datetime_local(value: datetime | None) -> str:
    """A stored instant as the `datetime-local` input shows it (UTC, minutes)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M") if value else ""
