"""An MCP client app: it starts the MCP server over stdio and calls its
``send_email`` tool for one tool call its model made (``call_1`` of round 0
of the turn ``conversation-1:user-1``, as the app would have stored it).
``--phase resume`` is the restarted app doing the same call again: an MCP
client has no resume of its own."""

import asyncio
import os
import sys

from common import parse_args, report, report_exception
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

HERE = os.path.dirname(os.path.abspath(__file__))


async def main():
    args = parse_args()
    params = StdioServerParameters(
        command=sys.executable,
        args=[os.path.join(HERE, "mcp_server.py"), args.downstream, args.url],
        env=dict(os.environ),
        cwd=HERE,
    )
    arguments = {"to": "a@example.com", "body": "hi"}
    try:
        async with stdio_client(params) as (read, write):
            if args.adapter == "on":
                from toolledger.adapters import Downstream, LedgerRuntime
                from toolledger.adapters.mcp import MCPLedger

                runtime = LedgerRuntime(os.path.join(args.dir, "ledger.db"))
                ledger_mcp = MCPLedger(runtime, server="mail")
                async with ledger_mcp.session(read, write) as session:
                    await session.initialize()

                    async def lookup(_args, call):
                        found = await session.call_tool("find_email_by_ref", {"ref": call.downstream_key})
                        text = found.content[0].text if found.content else ""
                        return found if text else None

                    ledger_mcp.tool(
                        "send_email",
                        downstream=Downstream(args.downstream),
                        lookup=lookup if args.downstream == "lookup" else None,
                    )
                    try:
                        done = await ledger_mcp.call_tool(
                            session, "send_email", arguments,
                            operation_id="conversation-1:user-1", round=0, call_id="call_1",
                        )
                    except Exception as exc:  # noqa: BLE001 - reported to the test
                        report_exception(exc)
                        return
                    report(
                        status="ok", final=done.result.content[0].text, replayed=done.replayed,
                        jsonrpc_id=done.jsonrpc_id,
                    )
            else:
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    result = await session.call_tool("send_email", arguments)
                    report(status="ok", final=result.content[0].text)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report_exception(exc)


if __name__ == "__main__":
    asyncio.run(main())
