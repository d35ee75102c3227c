"""Inbound webhooks: a third party's delivery checked and turned into an event.

* `github`: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>`; the event is the hook's
  `event`, else `github.<X-GitHub-Event>`; the delivery id is `X-GitHub-Delivery`.
* `stripe`: `Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>` (any `v1`
  may match) within `STRIPE_TOLERANCE_S` of now; the event is the hook's `event`, else
  `stripe.<type>`; the delivery id is the payload's `id`.
* `hmac`: `X-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>`; the event is the hook's
  `event` (required at create); the delivery id is `X-Delivery-Id`, else the body's SHA-256.

A bad or missing signature is refused before anything is parsed or stored. A delivery id seen
before is the same event (its id is `hook:<hook id>:<delivery id>`): a replay is a 200 that starts
nothing. Signatures are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

STRIPE_TOLERANCE_S = 300
PROVIDERS = ("github", "stripe", "hmac")


class BadSignature(Exception):
    """The delivery is not signed with the hook's secret (or too old, for Stripe)."""


class BadPayload(Exception):
    """Signed, but not a JSON document the hook can turn into an event."""


@dataclass(frozen=True, slots=True)
class Delivery:
    event_name: str
    delivery_id: str
    data: dict[str, Any]


def _hex_hmac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _check_sha256_header(secret: str, body: bytes, header: str | None) -> None:
    if not header or not header.startswith("sha256="):
        raise BadSignature("missing sha256= signature")
    if not hmac.compare_digest(header[len("sha256=") :], _hex_hmac(secret, body)):
        raise BadSignature("signature does not match")


def _check_stripe(secret: str, body: bytes, header: str | None, now: float) -> None:
    if not header:
        raise BadSignature("missing Stripe-Signature")
    parts = [p.split("=", 1) for p in header.split(",") if "=" in p]
    stamps = [v for k, v in parts if k.strip() == "t"]
    signatures = [v for k, v in parts if k.strip() == "v1"]
    if len(stamps) != 1 or not stamps[0].isdigit() or not signatures:
        raise BadSignature("malformed Stripe-Signature")
    if abs(now - int(stamps[0])) > STRIPE_TOLERANCE_S:
        raise BadSignature("timestamp outside the tolerance")
    expected = _hex_hmac(secret, stamps[0].encode() + b"." + body)
    if not any(hmac.compare_digest(s, expected) for s in signatures):
        raise BadSignature("signature does not match")


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadPayload("the body is not JSON") from None
    return parsed if isinstance(parsed, dict) else {"payload": parsed}


def read_delivery(
    provider: str,
    secret: str,
    fixed_event: str | None,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float | None = None,
) -> Delivery:
    """Verify a delivery and say what event it is; BadSignature / BadPayload otherwise.
    `headers` are looked up in lower case."""
    if provider == "github":
        _check_sha256_header(secret, body, headers.get("x-hub-signature-256"))
        data = _json_object(body)
        kind = headers.get("x-github-event") or "unknown"
        return Delivery(
            fixed_event or f"github.{kind}"[:200], _delivery_id(headers.get("x-github-delivery"), body), data
        )
    if provider == "stripe":
        _check_stripe(secret, body, headers.get("stripe-signature"), time.time() if now is None else now)
        data = _json_object(body)
        kind = str(data["type"]) if isinstance(data.get("type"), str) else "unknown"
        stripe_id = data.get("id") if isinstance(data.get("id"), str) else None
        return Delivery(fixed_event or f"stripe.{kind}"[:200], _delivery_id(stripe_id, body), data)
    _check_sha256_header(secret, body, headers.get("x-signature-256"))
    assert fixed_event is not None  # required at create for the generic form
    return Delivery(fixed_event, _delivery_id(headers.get("x-delivery-id"), body), _json_object(body))


def _delivery_id(given: str | None, body: bytes) -> str:
    if given:
        return given[:150]
    return "sha256-" + hashlib.sha256(body).hexdigest()
