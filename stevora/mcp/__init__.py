"""Tools from Model Context Protocol servers (docs/mcp.md).

`config` reads the worker's `mcpServers` file, `naming` maps a server's tool names to the names a
model sees, `client` holds this process's connections (stdio servers started lazily and restarted
after a crash; streamable HTTP sessions pooled), and `results` turns a `tools/call` result into
the trace's output and the text the model reads. Built on the official `mcp` SDK: no JSON-RPC here.
"""

from stevora.mcp.config import McpConfigError, McpServerConfig, load_mcp_config, parse_mcp_config
from stevora.mcp.naming import exposed_tool_name, valid_server_name

__all__ = [
    "McpConfigError",
    "McpServerConfig",
    "exposed_tool_name",
    "load_mcp_config",
    "parse_mcp_config",
    "valid_server_name",
]
