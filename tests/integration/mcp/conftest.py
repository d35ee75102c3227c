"""The loop's fixtures (the fake provider APIs through the real SDKs) for the MCP tests."""

from tests.integration.loop.conftest import fake, fake_llm_session, sdk

__all__ = ["fake", "fake_llm_session", "sdk"]
