"""Outbound webhooks: signed delivery of the outbox rows the engine writes, and verification."""

from stevora.webhooks.delivery import deliver_due, sign, verify_signature

__all__ = ["deliver_due", "sign", "verify_signature"]
