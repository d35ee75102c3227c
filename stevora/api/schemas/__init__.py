"""Pydantic models of the HTTP API's request bodies and response data (camelCase on the wire)."""
