"""An OpenAI Agents SDK agent (``Runner.run`` with a ``SQLiteSession``)
whose model is scripted: shown a user message it calls ``send_email`` with a
fresh ``call_id`` (as a real model does); shown the tool's output it ends.
``--phase resume`` resumes as the SDK's sessions allow: ``Runner.run`` again
on the same session with no new input. Tracing is off (no network)."""

import asyncio
import os
import sys
import uuid

from common import Client, find_email, parse_args, report, report_exception, send_email
from agents import Agent, FunctionTool, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

set_tracing_disabled(True)


class ScriptedModel(Model):
    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, **kwargs):
        items = input if isinstance(input, list) else [{"role": "user", "content": input}]
        last = items[-1]
        if last.get("type") == "function_call_output":
            out = ResponseOutputMessage(
                id="msg_final", type="message", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text=f"done: {last.get('output')}", annotations=[])],
            )
        else:
            out = ResponseFunctionToolCall(
                id=f"fc_{uuid.uuid4().hex[:12]}", type="function_call", call_id=f"call_{uuid.uuid4().hex[:12]}",
                name="send_email", arguments='{"to":"a@example.com","body":"hi"}', status="completed",
            )
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


async def main():
    args = parse_args()
    client = Client(args.url)
    adapter = args.adapter != "off"

    @function_tool(failure_error_function=None)
    def send_email_tool(to: str, body: str) -> str:
        """Sends an email."""
        key = None
        if adapter:
            from toolledger.adapters import current_call

            key = current_call().downstream_key
        return send_email(client, args.downstream, {"to": to, "body": body}, key)

    send_email_tool.name = "send_email"
    model = ScriptedModel()
    tools: list[FunctionTool] = [send_email_tool]
    session = SQLiteSession("conversation-1", os.path.join(args.dir, "session.db"))
    run_input = "email a@example.com" if args.phase == "first" else []
    try:
        if adapter:
            from toolledger.adapters import Downstream, LedgerRuntime
            from toolledger.adapters.openai_agents import AgentsLedger

            runtime = LedgerRuntime(os.path.join(args.dir, "ledger.db"))
            agents = AgentsLedger(runtime)
            lookup = (lambda a, call: find_email(client, call.downstream_key)) if args.downstream == "lookup" else None
            tools = [agents.tool(send_email_tool, downstream=Downstream(args.downstream), lookup=lookup)]
            if args.adapter == "on":
                model = agents.model(model)
            agent = Agent(name="mailer", model=model, tools=tools)
            result = await agents.run(agent, run_input, run_id="conversation-1:user-1", session=session)
        else:
            agent = Agent(name="mailer", model=model, tools=tools)
            result = await Runner.run(agent, run_input, session=session)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report_exception(exc)
        return
    report(status="ok", final=result.final_output)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
