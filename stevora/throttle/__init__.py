"""Request limits shared by the API and the UI (below both, so neither imports the other for
them): per-workspace token buckets (`workspace_requests`) and failed-authentication limits per
client address (`failed_auth`)."""
