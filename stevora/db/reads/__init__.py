"""The reads the API, the UI and the CLI (through the API) share: one module per resource, each
returning typed, frozen rows (`rows.Row`), so the driver's records stop in `stevora.db`.
The API's own writes of a resource (create a webhook, revoke a key, ...) live beside its reads."""
