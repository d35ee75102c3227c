"""The definition `stevora prompt` stores: embedded `--approve-each` gates every local tool; with
`--url` local tools are client tools; a conversation's history is read from the input."""

from __future__ import annotations

from stevora.cli.prompt import _offered, prompt_definition
from stevora.definitions import parse_definition
from stevora.ids import new_id
from stevora.tools import default_registry


def test_local_tools_are_gated_inline_with_approve_each_or_client_tools_with_url() -> None:
    name = new_id("lookup")

    @default_registry.tool(name=name)
    def lookup(city: str) -> str:
        """Look a city up."""
        return city

    gated = _offered([name, "server_only"], None, approve_each=True)
    assert gated[0] == {
        "name": name,
        "description": "Look a city up.",
        "parameters": default_registry.get(name).parameters,  # type: ignore[union-attr]
        "requiresApproval": True,
    }
    assert gated[1] == "server_only"  # not known here: the server's registered tool, by name
    client = _offered([name], default_registry.copy(), approve_each=False)
    assert client[0]["execution"] == "client"  # type: ignore[index]
    assert _offered([name], None, approve_each=False) == [name]
    for tools in (gated, client):
        parse_definition(prompt_definition("gpt-4o", tools, 5, None))  # a valid definition


def test_history_messages_read_their_text_from_the_input() -> None:
    spec = prompt_definition("gpt-4o", [], 5, "Be brief.", ["user", "assistant"])
    messages = spec["steps"][0]["messages"]
    assert messages == [
        {"role": "user", "content": "{{input.history.0.content}}"},
        {"role": "assistant", "content": "{{input.history.1.content}}"},
        {"role": "user", "content": "{{input.prompt}}"},
    ]
    # The same shape reuses one stored definition; another shape is another version.
    assert (
        spec["version"] == prompt_definition("gpt-4o", [], 5, "Be brief.", ["user", "assistant"])["version"]
    )
    assert spec["version"] != prompt_definition("gpt-4o", [], 5, "Be brief.")["version"]
