"""An MCP server (stdio) whose tools send email through the loopback
downstream: ``send_email`` to the downstream class given on the command line
(with the ``io.toolledger/idempotency-key`` from the request's ``_meta`` as
the key or reference, when there is one), and ``find_email`` (by reference).

With ``TL_CRASH_AFTER_EFFECT=1`` in its environment, after the downstream
answered it SIGKILLs its client (its parent process) and exits: the effect
exists, the client never got the answer."""

import os
import signal
import sys

from common import Client, find_email
from mcp.server.mcpserver import Context, MCPServer

KEY = "io.toolledger/idempotency-key"


def main():
    cls, url = sys.argv[1], sys.argv[2]
    client = Client(url)
    server = MCPServer("mail")

    @server.tool()
    def send_email(to: str, body: str, ctx: Context) -> str:
        """Sends an email."""
        meta = ctx.request_context.meta
        key = None
        if meta is not None:
            extra = meta if isinstance(meta, dict) else (meta.model_extra or {})
            key = extra.get(KEY)
        if cls == "key":
            answer = client.send("key", {"to": to, "body": body}, key=key)
        elif cls == "lookup":
            answer = client.send("lookup", {"to": to, "body": body}, ref=key)
        else:
            answer = client.send("neither", {"to": to, "body": body})
        if os.environ.get("TL_CRASH_AFTER_EFFECT") == "1":
            os.kill(os.getppid(), signal.SIGKILL)
            os._exit(0)
        return f"sent {answer['id']}"

    @server.tool()
    def find_email_by_ref(ref: str) -> str:
        """Finds an email sent with this reference ('' when there is none)."""
        return find_email(client, ref) or ""

    server.run("stdio")


if __name__ == "__main__":
    main()
