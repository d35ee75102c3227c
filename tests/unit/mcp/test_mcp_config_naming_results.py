"""The worker's mcpServers file, the names a model sees for MCP tools, and results as outputs."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from mcp_types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from stevora.mcp import McpConfigError, exposed_tool_name, load_mcp_config, parse_mcp_config
from stevora.mcp.results import convert_result


def test_a_config_file_declares_stdio_and_http_servers(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "files": {
                        "command": "npx",
                        "args": ["-y", "fs"],
                        "env": {"A": "1"},
                        "timeoutMs": 5000,
                        "x": 1,
                    },
                    "search": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "k"}},
                }
            }
        )
    )
    servers = load_mcp_config(path)
    assert servers["files"].transport == "stdio" and servers["files"].args == ("-y", "fs")
    assert servers["files"].timeout_ms == 5000 and servers["files"].env == {"A": "1"}
    assert servers["search"].transport == "http" and servers["search"].timeout_ms == 30_000


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, 'expected an object with an "mcpServers" object'),
        ({"mcpServers": {"bad name": {"command": "x"}}}, "mcpServers.bad name: server names must be"),
        ({"mcpServers": {"both": {"command": "x", "url": "http://h/mcp"}}}, 'give either "command"'),
        ({"mcpServers": {"none": {}}}, 'give either "command"'),
        ({"mcpServers": {"t": {"command": "x", "timeoutMs": 0}}}, "mcpServers.t.timeoutMs"),
        ({"mcpServers": {"s": "python"}}, "mcpServers.s: expected an object"),
    ],
)
def test_a_bad_config_names_the_field(document: object, message: str) -> None:
    with pytest.raises(McpConfigError, match=None) as caught:
        parse_mcp_config(document, source="mcp.json")
    assert message in str(caught.value) and str(caught.value).startswith("mcp.json: ")


def test_an_unreadable_config_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(McpConfigError, match="cannot read"):
        load_mcp_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(McpConfigError, match="not valid JSON"):
        load_mcp_config(tmp_path / "bad.json")


def test_tool_names_are_valid_provider_names_of_at_most_64_characters() -> None:
    assert exposed_tool_name("files", "read_file") == "files_read_file"
    assert exposed_tool_name("gh", "issues.create/v2") == "gh_issues_create_v2"
    long_a, long_b = "x" * 80 + "a", "x" * 80 + "b"
    name_a, name_b = exposed_tool_name("srv", long_a), exposed_tool_name("srv", long_b)
    assert len(name_a) == 64 and len(name_b) == 64 and name_a != name_b
    for name in (name_a, exposed_tool_name("s", "ünï cödé")):
        assert all(c.isascii() and (c.isalnum() or c in "_-") for c in name)


def test_text_structured_binary_and_error_results_become_outputs() -> None:
    text = convert_result(
        CallToolResult(content=[TextContent(type="text", text="a"), TextContent(type="text", text="b")])
    )
    assert (text.is_error, text.output) == (False, "a\nb")
    structured = convert_result(
        CallToolResult(content=[TextContent(type="text", text='{"n": 1}')], structured_content={"n": 1})
    )
    assert structured.output == {"n": 1}
    png = b"\x89PNG fake"
    mixed = convert_result(
        CallToolResult(
            content=[
                ImageContent(type="image", data=base64.b64encode(png).decode(), mime_type="image/png"),
                ImageContent(type="image", data=base64.b64encode(png).decode(), mime_type="image/png"),
                EmbeddedResource(
                    type="resource",
                    resource=TextResourceContents(uri="file:///a.txt", text="hi", mime_type="text/plain"),
                ),
                ResourceLink(type="resource_link", uri="file:///b.txt", name="b"),
                ImageContent(type="image", data="!!not base64!!", mime_type="image/png"),
            ]
        )
    )
    assert len(mixed.blobs) == 1 and mixed.blobs[0].data == png  # the same image is stored once
    blocks = mixed.output["content"]
    assert (
        blocks[0]
        == blocks[1]
        == {"type": "image", "mimeType": "image/png", "bytes": len(png), "sha256": mixed.blobs[0].sha256}
    )
    assert blocks[2]["text"] == "hi" and blocks[3]["type"] == "resource_link"
    assert blocks[4]["error"] == "content is not valid base64"
    assert "base64" not in json.dumps(blocks[:2])
    failed = convert_result(
        CallToolResult(content=[TextContent(type="text", text="x" * 10_000)], is_error=True)
    )
    assert failed.is_error and len(failed.error_text) == 4_000
    assert (
        convert_result(CallToolResult(content=[], is_error=True)).error_text
        == "The MCP tool reported an error"
    )


def test_an_mcp_tools_entry_is_checked_where_the_definition_is() -> None:
    from stevora.definitions import McpToolsDef, parse_definition
    from stevora.errors import ValidationError

    def step(*tools: object, **extra: object) -> dict[str, object]:
        return {
            "name": "s",
            "type": "llm",
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": list(tools),
            **extra,
        }

    ok = parse_definition(
        {"name": "a", "version": "1", "steps": [step({"mcp": "files", "approve": ["write_file"]})]}
    )
    (entry,) = ok.steps[0].tools  # type: ignore[union-attr]
    assert isinstance(entry, McpToolsDef) and entry.name == "files" and entry.approve == ["write_file"]
    # A named toolChoice may name a tool under an MCP entry's prefix (known only when the step runs).
    parse_definition(
        {"name": "a", "version": "1", "steps": [step({"mcp": "files"}, toolChoice={"name": "files_read"})]}
    )
    for bad, path in [
        (step({"mcp": "no spaces"}), "steps[0].tools[0].mcp"),
        (step({"mcp": "files", "prefix": "9bad"}), "steps[0].tools[0].prefix"),
        (step({"mcp": "a"}, {"mcp": "b", "prefix": "a"}), "steps[0].tools[1]"),
        (step({"mcp": "files", "unknown": 1}), "steps[0].tools[0].unknown"),
    ]:
        with pytest.raises(ValidationError) as caught:
            parse_definition({"name": "a", "version": "1", "steps": [bad]})
        assert any(p["path"].startswith(path) for p in caught.value.details["errors"]), caught.value.details
