"""An MCP client for Airlock's tests: the MCP Python SDK, authorized by
the SDK's own OAuth client credentials flow.

Usage: ``client.py URL CLIENT_ID SECRET ISSUER [TOOL ARGUMENTS_JSON]``.

It connects to the MCP server at URL with no token, follows the server's
401 to its protected resource metadata and the authorization server's
metadata, gets a token for the resource, and then lists the tools and
calls TOOL (when given). It prints one JSON object on stdout:
``{"tools": [...], "result": {...}}``, or ``{"error": "..."}``.
"""

import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
)
from mcp.client.streamable_http import streamable_http_client


class Memory(TokenStorage):
    def __init__(self):
        self.tokens = None
        self.client = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, client_info):
        self.client = client_info


async def main(url, client_id, secret, issuer, tool=None, arguments="{}"):
    auth = ClientCredentialsOAuthProvider(
        server_url=url,
        storage=Memory(),
        client_id=client_id,
        client_secret=secret,
        issuer=issuer,
    )
    out = {}
    async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                out["tools"] = sorted(t.name for t in listed.tools)
                if tool:
                    result = await session.call_tool(tool, json.loads(arguments))
                    out["result"] = result.model_dump(mode="json", exclude_none=True)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    try:
        asyncio.run(main(*sys.argv[1:]))
    except BaseException as e:  # noqa: BLE001 - the test reads what failed
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(1)
