"""HTTP client commands (filled in by the client/CLI work)."""
