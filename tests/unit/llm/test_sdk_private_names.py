"""The Anthropic adapter reads two private SDK names (`_constants.MODEL_NONSTREAMING_TOKENS`,
`_calculate_nonstreaming_timeout`); pyproject sets no upper bound on the SDK, so an SDK without
them must neither break the import nor a plain call."""

from __future__ import annotations

import subprocess
import sys
import types

import anthropic

from stevora.llm.anthropic_provider import _nonstreaming_timeout


def test_the_adapter_imports_when_the_sdk_has_no_model_nonstreaming_tokens() -> None:
    code = (
        "import anthropic._constants as constants\n"
        "del constants.MODEL_NONSTREAMING_TOKENS\n"
        "import stevora.llm.anthropic_provider as adapter\n"
        "assert adapter.MODEL_NONSTREAMING_TOKENS == {}\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_plain_call_keeps_the_clients_timeout_when_the_sdk_cannot_size_one() -> None:
    kwargs = {"max_tokens": 1024, "model": "claude-haiku-4-5"}
    without = types.SimpleNamespace()  # an SDK client without `_calculate_nonstreaming_timeout`
    assert _nonstreaming_timeout(without, kwargs) is anthropic.NOT_GIVEN  # type: ignore[arg-type]
    client = anthropic.AsyncAnthropic(api_key="k")
    sized = _nonstreaming_timeout(client, kwargs)
    assert sized is not anthropic.NOT_GIVEN and sized.read == 600
