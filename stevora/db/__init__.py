"""Persistence: table models, engine/session factory, migrations, repositories."""
