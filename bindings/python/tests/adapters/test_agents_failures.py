"""OpenAI Agents SDK: the model API fails (a transient error: nothing was
done, asking again is safe), the app runs the same user turn again
(same run_id, as the adapter says a resume must) once the API is back.

OpenAI Agents SDK: agents as tools (`Agent.as_tool`), the SDK's
orchestrator pattern. The orchestrator calls two sub-agents in one turn;
each sub-agent (its model wrapped by the same AgentsLedger, as the docs say
to wrap every model) sends its own email. Two different emails must go out,
each once.
"""

import asyncio
import pytest

from toolledger.adapters import Downstream, LedgerRuntime, current_call


@pytest.fixture
def runtime(tmp_path):
    rt = LedgerRuntime(str(tmp_path / "ledger.db"), backoff_base_ms=1, backoff_max_ms=2)
    yield rt
    rt.close()


def test_agents_a_failed_model_call_does_not_kill_the_run_id(runtime):
    from agents import Agent, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    from toolledger.adapters.openai_agents import AgentsLedger

    set_tracing_disabled(True)
    api_down = [True]
    model_calls = []

    class Scripted(Model):
        async def get_response(self, *args, **kwargs):
            model_calls.append(1)
            if api_down[0]:
                raise ConnectionError("model API unreachable")
            return ModelResponse(output=[ResponseOutputMessage(
                id="m", type="message", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text="done", annotations=[])])],
                usage=Usage(), response_id=None)

        def stream_response(self, *a, **k):
            raise NotImplementedError

    agents = AgentsLedger(runtime)
    agent = Agent(name="mail", model=agents.model(Scripted()), tools=[])

    async def main():
        try:
            await agents.run(agent, "hi", run_id="conv:1")
        except Exception as e:  # noqa: BLE001
            first_error = e
        else:
            first_error = None
        calls_first = len(model_calls)
        api_down[0] = False
        try:
            again = await agents.run(agent, "hi", run_id="conv:1")
        except Exception as e:  # noqa: BLE001
            again = e
        return first_error, calls_first, again

    first_error, calls_first, again = asyncio.run(asyncio.wait_for(main(), 60))
    assert isinstance(first_error, ConnectionError), f"the app gets {type(first_error).__name__}: {first_error}"
    assert calls_first == 1, f"the ledger asked the failing model {calls_first} times in a row"
    assert not isinstance(again, Exception), f"the same run_id, API back: {type(again).__name__}: {again}"
    assert again.final_output == "done"


def _two_sub_agents(runtime, wrap):
    from agents import Agent, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from toolledger.adapters.openai_agents import AgentsLedger

    set_tracing_disabled(True)
    sent = []

    def text(t):
        return ModelResponse(output=[ResponseOutputMessage(
            id="m", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text=t, annotations=[])])], usage=Usage(), response_id=None)

    def calls(*items):
        return ModelResponse(output=[ResponseFunctionToolCall(
            type="function_call", call_id=cid, name=name, arguments=args, status="completed")
            for cid, name, args in items], usage=Usage(), response_id=None)

    def answered(input):
        return isinstance(input, list) and any(isinstance(i, dict) and i.get("type") == "function_call_output"
                                               for i in input)

    class Sub(Model):
        def __init__(self, who):
            self.who = who

        async def get_response(self, system_instructions, input, *args, **kwargs):
            await asyncio.sleep(0.05)  # a model takes a moment
            if answered(input):
                return text(f"{self.who} done")
            return calls((f"call_{self.who}", "send_email", f'{{"to":"{self.who}@example.com"}}'))

        def stream_response(self, *a, **k):
            raise NotImplementedError

    class Orchestrator(Model):
        async def get_response(self, system_instructions, input, *args, **kwargs):
            if answered(input):
                return text("all done")
            return calls(("call_o1", "ask_alice", '{"input":"mail"}'), ("call_o2", "ask_bob", '{"input":"mail"}'))

        def stream_response(self, *a, **k):
            raise NotImplementedError

    @function_tool(failure_error_function=None)
    def send_email(to: str) -> str:
        """Sends an email."""
        sent.append(to)
        return f"sent to {to}"

    agents = AgentsLedger(runtime)
    send = agents.tool(send_email, downstream=Downstream.KEY)
    alice = Agent(name="alice", model=agents.model(Sub("alice")), tools=[send])
    bob = Agent(name="bob", model=agents.model(Sub("bob")), tools=[send])
    orchestrator = Agent(name="orchestrator", model=agents.model(Orchestrator()), tools=[
        wrap(agents, alice.as_tool("ask_alice", "Asks alice.")), wrap(agents, bob.as_tool("ask_bob", "Asks bob."))])

    async def main():
        try:
            return await agents.run(orchestrator, "mail both", run_id="conv:1", max_turns=5)
        except Exception as e:  # noqa: BLE001
            return e

    result = asyncio.run(asyncio.wait_for(main(), 60))
    stored = [e.execution_id for e in runtime.ledger.list("openai-agents:conv:1")]
    return sent, result, stored


def test_agents_unwrapped_sub_agents_are_refused_before_anything_runs(runtime):
    # As before the fix: the side-effecting tool and every model wrapped,
    # the agent tools not. Their nested runs would share the calling run's
    # turns (bob's run was handed alice's recorded model response and its
    # email was never sent): refused up front, naming the fix.
    sent, result, stored = _two_sub_agents(runtime, lambda agents, t: t)
    assert isinstance(result, ValueError), f"{type(result).__name__}: {result}"
    assert "AgentsLedger.agent_tool" in str(result) and "ask_alice" in str(result)
    assert sent == [] and stored == []


def test_agents_two_sub_agents_wrapped_as_agent_tools_each_send_their_own(runtime):
    # Each nested run has its own identity: both emails, each once.
    sent, result, stored = _two_sub_agents(runtime, lambda agents, t: agents.agent_tool(t))
    assert not isinstance(result, Exception), f"{type(result).__name__}: {result}"
    assert sorted(sent) == ["alice@example.com", "bob@example.com"], f"sent {sent}; stored {stored}"


def test_agents_an_agent_tool_also_recorded_with_agents_tool_is_not_refused(runtime):
    # agent_tool marks its copy with a plain attribute; AgentsLedger.tool
    # copies with dataclasses.replace, which keeps the SDK's own
    # _is_agent_tool/_agent_instance fields but drops that mark: a wrapped
    # agent tool is then refused as unwrapped.
    sent, result, stored = _two_sub_agents(
        runtime, lambda agents, t: agents.tool(agents.agent_tool(t), downstream=Downstream.KEY))
    assert not isinstance(result, ValueError), f"{type(result).__name__}: {result}"


def test_agents_model_takes_a_model_name_as_agent_does(runtime, monkeypatch):
    # `Agent(model="gpt-4.1")` is the SDK's usual form, so the README's
    # `agents.model(model)` gets a name as often as a Model. A name was kept
    # as it was and the run failed at its first model call with
    # AttributeError ('str' object has no attribute 'get_response'). It is
    # resolved as the SDK resolves an agent's model name; anything else is
    # refused at once.
    from agents.models.interface import Model

    from toolledger.adapters.openai_agents import AgentsLedger

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")  # no request is made
    agents = AgentsLedger(runtime)
    wrapped = agents.model("gpt-4.1")
    assert isinstance(wrapped, Model) and isinstance(wrapped.inner, Model)
    assert getattr(wrapped.inner, "model", None) == "gpt-4.1"
    with pytest.raises(TypeError, match="Model"):
        agents.model(42)
