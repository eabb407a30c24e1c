"""OpenAI Agents SDK: function tools whose calls run through the ledger, and
a model whose responses are kept so that a resumed run sees the same tool
calls.

Tested with ``openai-agents`` 0.24.0 (``openai`` 3.57.0).

::

    runtime = LedgerRuntime("ledger.db")                               # once per process
    agents = AgentsLedger(runtime)
    agent = Agent(name="mail", model=agents.model(model),              # keep model responses
                  tools=[agents.tool(send_email, downstream=Downstream.KEY)])
    result = await agents.run(agent, "send it", run_id="conv42:msg7", session=session)

Identity. A call's execution is ``(run id, turn, tool-call id)``:

* operation = ``openai-agents:<run_id>``: the app names the user turn being
  answered (``run_id=``, stable across a resume: a conversation id and the
  index of the user message, say). A regenerated answer is a new run id;
* round = the turn (1 for the first model response of the run, counted by
  the wrapped model; a run resumed from its ``RunState``, after an approval,
  goes on from the state's turn, as the SDK does);
* call id = the model's ``call_id`` (``ToolContext.tool_call_id``).

Why the model is wrapped too. The SDK's session keeps the user's input when
a run starts and the model's tool calls only when their turn ends: a process
killed while a tool runs leaves a session without the call, and the
documented resume (``Runner.run`` again on the same session) asks the model
again, which answers with a *new* ``call_id`` (and maybe other arguments).
To the ledger that is a regenerated turn — a new execution — so wrapping the
tools alone does not prevent the second effect. ``agents.model(m)`` records
each model response in the ledger (under the run id and turn, as an
execution of the pseudo-tool ``toolledger.model_response``) before the
run acts on it, and a resumed run with the same run id gets the recorded
response back instead of a new one: same tool calls, same ids, so a
committed call is replayed and one left running is reconciled.

The tool's own code reads ``current_call().downstream_key``. Make function
tools with ``failure_error_function=None``: otherwise the SDK turns an
exception raised after the request left (timeout, reset) into an error
string, which would be recorded as the call's result instead of an unknown
outcome. An unknown outcome raises :class:`OutcomeUnknown` out of
``Runner.run``: nothing is resent.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from agents import FunctionTool, Runner
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.run_state import RunState
from agents.usage import Usage
from openai.types.responses import ResponseOutputItem
from pydantic import TypeAdapter

from .. import _driven
from ._core import (  # noqa: F401
    CallNotExecuted, Downstream, LedgerRuntime, OutcomeUnknown, ToolSpec, _json, _JsonText, _too_large,
    current_call,
)


class _ModelCallFailed(Exception):
    """The wrapped model raised: no response, and nothing to protect (asking
    the model again is safe). Reported as not committed (the next ask asks
    again), and the model's own exception goes on to the SDK and the app."""

    def __init__(self, error: Exception):
        super().__init__(f"{type(error).__name__} raised by the model")
        self.error = error


if _ModelCallFailed not in _driven.CONTROL_FLOW:
    _driven.CONTROL_FLOW = _driven.CONTROL_FLOW + (_ModelCallFailed,)

TESTED_VERSIONS = {"openai-agents": "0.24.0", "openai": "3.57.0"}

MODEL_TOOL = "toolledger.model_response"

_OUTPUT_ITEMS = TypeAdapter(list[ResponseOutputItem])


@dataclass
class _RunScope:
    run_id: str
    turn: int = 0
    """The last turn whose model response the run got (its tools run under it)."""
    tools: dict = field(default_factory=dict)


_SCOPE: contextvars.ContextVar[Optional[_RunScope]] = contextvars.ContextVar("toolledger_agents_run", default=None)


def _scope(what: str) -> _RunScope:
    scope = _SCOPE.get()
    if scope is None:
        raise RuntimeError(f"{what}: run the agent with AgentsLedger.run(..., run_id=...) so calls have an identity")
    return scope


class AgentsLedger:
    """Wraps function tools and models for one :class:`LedgerRuntime`."""

    def __init__(self, runtime: LedgerRuntime):
        self.runtime = runtime
        if not runtime.registered(MODEL_TOOL):
            runtime.register(ToolSpec(name=MODEL_TOOL, run=_no_detached_model_call, downstream=Downstream.KEY))

    def operation(self, run_id: str) -> str:
        return f"openai-agents:{run_id}"

    # -- tools ------------------------------------------------------------

    def tool(
        self,
        tool: FunctionTool,
        *,
        downstream: Downstream,
        lookup: Optional[Callable[[dict, Any], Any]] = None,
        version: int = 1,
        landing_window_ms: Optional[int] = None,
    ) -> FunctionTool:
        """A copy of ``tool`` whose calls run through the ledger."""
        inner = tool.on_invoke_tool

        def run_detached(args: dict) -> Any:
            raise RuntimeError(
                f"{tool.name}: cannot resend without the run that called it; "
                "resume the run (same run_id) instead of executor.recover()"
            )

        self.runtime.register(
            ToolSpec(
                name=tool.name,
                run=run_detached,
                downstream=downstream,
                lookup=lookup,
                version=version,
                landing_window_ms=landing_window_ms,
            )
        )
        runtime = self.runtime
        operation = self.operation

        async def on_invoke_tool(ctx, arguments: str) -> Any:
            scope = _scope(tool.name)
            produced: list = []
            raw: list = []

            async def body():
                output = await inner(ctx, arguments)
                raw.append(output)
                return _recorded_output(output, produced)

            done = await runtime.acall(
                operation(scope.run_id), scope.turn, ctx.tool_call_id, tool.name, arguments or "{}", body
            )
            # A JSON scalar this call produced and the ledger committed as
            # it is: handed back as it is (what parsing the text gives).
            if produced and not done.replayed and done.result_json == produced[0]:
                return produced[1]
            stored = json.loads(done.result_json)
            kept = _kept_as_text(stored)
            if kept is not _NOT_KEPT:
                if produced and not done.replayed and stored == produced[0]:
                    return produced[1]
                return kept
            if _too_large(stored):
                if raw and not done.replayed:
                    # This call's own output, which the ledger could not keep.
                    return raw[-1]
                return (f"toolledger: the tool ran; its result ({stored.get('bytes')} bytes) was too large "
                        "to store")
            return stored

        wrapped = dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)
        if getattr(tool, "_toolledger_nested_run", False):
            # Wrapped with `agent_tool` first: its nested run keeps its own
            # identity (the mark is not a dataclass field `replace` copies).
            wrapped._toolledger_nested_run = True
        return wrapped

    def agent_tool(self, tool: FunctionTool) -> FunctionTool:
        """A copy of an agent tool (``Agent.as_tool(...)``) whose nested run
        gets its own identity: ``<run_id>/<turn>/<call_id>`` of the call that
        started it. Without it a nested run's model responses and tool calls
        are counted in the calling run's turns, and two nested runs in one
        turn ask for the same turn's response (one gets the other's)."""
        inner = tool.on_invoke_tool

        async def on_invoke_tool(ctx, arguments: str) -> Any:
            parent = _scope(tool.name)
            token = _SCOPE.set(_RunScope(run_id=f"{parent.run_id}/{parent.turn}/{ctx.tool_call_id}"))
            try:
                return await inner(ctx, arguments)
            finally:
                _SCOPE.reset(token)

        wrapped = dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)
        wrapped._toolledger_nested_run = True
        return wrapped

    # -- the model ----------------------------------------------------------

    def model(self, model: "Model | str", *, provider: Any = None) -> Model:
        """``model``, with each response kept in the ledger (see the module
        docs). A model name (what ``Agent(model="gpt-4.1")`` takes) is made
        a model the way the SDK makes an agent's: by ``provider``'s
        ``get_model`` (by default the SDK's ``MultiProvider``, what
        ``RunConfig.model_provider`` defaults to)."""
        if isinstance(model, str):
            if provider is None:
                from agents.models.multi_provider import MultiProvider

                provider = MultiProvider()
            model = provider.get_model(model)
        if not isinstance(model, Model):
            raise TypeError(f"AgentsLedger.model(): a Model or a model name, not {type(model).__name__}")
        return _LedgerModel(model, self)

    # -- runs -----------------------------------------------------------------

    async def run(self, agent, input, *, run_id: str, **kwargs) -> Any:
        """``Runner.run(agent, input, **kwargs)`` with the calls named by
        ``run_id`` (the user turn being answered: keep it on a resume, give
        a new one to regenerate).

        Raises ``ValueError`` (nothing run) when an agent tool
        (``Agent.as_tool``) reachable from ``agent`` runs an agent whose
        model is kept by this ledger and is not wrapped with
        :meth:`agent_tool`: its nested run would ask for the calling run's
        model responses (two such tools in one turn would get one response)."""
        _check_nested_runs(agent, set())
        # A run resumed from its ``RunState`` (after an approval) goes on at
        # the SDK's turn: its tools run under the turn whose response asked
        # for them and its next model call is the next turn, not turn 1 again
        # (whose recorded response would be handed back as new).
        turn = getattr(input, "_current_turn", 0) if isinstance(input, RunState) else 0
        token = _SCOPE.set(_RunScope(run_id=run_id, turn=turn))
        try:
            return await Runner.run(agent, input, **kwargs)
        except Exception as exc:
            # The SDK wraps what a tool raised (UserError "Error running
            # tool …"); the app gets the ledger's own answer.
            ledger_error = _ledger_cause(exc)
            if ledger_error is not None and ledger_error is not exc:
                raise ledger_error from exc
            raise
        finally:
            _SCOPE.reset(token)


def _check_nested_runs(agent: Any, seen: set) -> None:
    """Refuses an agent tool left unwrapped whose nested agent (or one
    below it) keeps its model responses in the ledger."""
    if id(agent) in seen:
        return
    seen.add(id(agent))
    for tool in getattr(agent, "tools", None) or ():
        nested = getattr(tool, "_agent_instance", None)
        if not getattr(tool, "_is_agent_tool", False) or nested is None:
            continue
        if not getattr(tool, "_toolledger_nested_run", False) and _keeps_model(nested, set()):
            raise ValueError(
                f"tool {tool.name!r} runs agent {getattr(nested, 'name', '?')!r} (Agent.as_tool) whose model "
                "responses the ledger keeps: wrap it with AgentsLedger.agent_tool(...) so that its nested run "
                "gets its own identity"
            )
        _check_nested_runs(nested, seen)


def _keeps_model(agent: Any, seen: set) -> bool:
    """True when ``agent`` or an agent it runs as a tool or hands off to
    has a model wrapped by ``AgentsLedger.model``."""
    if id(agent) in seen:
        return False
    seen.add(id(agent))
    if isinstance(getattr(agent, "model", None), _LedgerModel):
        return True
    below = [getattr(t, "_agent_instance", None) for t in getattr(agent, "tools", None) or ()]
    below += [getattr(h, "agent", h) for h in getattr(agent, "handoffs", None) or ()]
    return any(b is not None and _keeps_model(b, seen) for b in below)


def _ledger_cause(exc: BaseException) -> Optional[BaseException]:
    seen = 0
    while exc is not None and seen < 32:  # bounded: cause chains can loop
        if isinstance(exc, (OutcomeUnknown, CallNotExecuted)):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _no_detached_model_call(args: dict) -> Any:
    raise RuntimeError("a model response is only asked for by its run")


def _stored_output(output: Any) -> Any:
    """What the ledger keeps of a function tool's output (JSON)."""
    if isinstance(output, (str, int, float, bool)) or output is None:
        return output
    dump = getattr(output, "model_dump", None)
    if dump is not None:
        return dump(mode="json")
    try:
        json.dumps(output)
    except (TypeError, ValueError):
        return str(output)
    return output


_SCALARS = (str, int, float, bool, type(None))

_NOT_KEPT = object()
_MAX_DEPTH = 64  # the library's default JsonLimits.max_depth


def _kept_as_text(stored: Any) -> Any:
    """The output whose recorded JSON text the library kept as a JSON
    string of that text (it keeps so a text that is not JSON by its rules:
    the escape of a lone surrogate, ``Infinity``/``NaN``, nesting deeper than
    its limit), or ``_NOT_KEPT``. A string is taken for such a text only when
    it is exactly what the adapter writes for a value the library refuses,
    which no tool's own string output is but by contrivance; a bare
    ``NaN``/``Infinity`` stays the string it reads as (the tool's string
    ``"NaN"`` is stored the same way)."""
    if type(stored) is not str or stored[:1] not in ('"', "[", "{"):
        return _NOT_KEPT
    try:
        value = json.loads(stored)
        if not _refused_by_the_ledger(value, 0) or _json(value) != stored:
            return _NOT_KEPT
    except (ValueError, RecursionError):
        return _NOT_KEPT
    return value


def _refused_by_the_ledger(value: Any, depth: int) -> bool:
    if type(value) is str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if type(value) is float:
        return value != value or value in (float("inf"), float("-inf"))
    if type(value) in (list, dict):
        if depth + 1 > _MAX_DEPTH:
            return True
        items = value.items() if type(value) is dict else enumerate(value)
        return any((type(k) is str and _refused_by_the_ledger(k, depth)) or _refused_by_the_ledger(v, depth + 1)
                   for k, v in items)
    return False


def _recorded_output(output: Any, produced: list) -> Any:
    """What the ledger records for a function tool's output: its JSON text
    (``_stored_output``'s form, serialised once). For a plain JSON scalar
    (``str``, ``int``, ``float``, ``bool``, ``None``: what parsing its text
    gives back unchanged) the text and the value are kept in ``produced``."""
    if type(output) in _SCALARS:
        text = _JsonText(_json(output))
        produced[:] = [text, output]
        return text
    stored = _stored_output(output)
    try:
        return _JsonText(_json(stored))
    except (TypeError, ValueError):
        return stored


class _LedgerModel(Model):
    """A model whose responses are recorded per (run id, turn)."""

    def __init__(self, inner: Model, owner: AgentsLedger):
        self.inner = inner
        self.owner = owner

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, **kwargs):
        scope = _scope("model")
        # A model call the SDK retries after a failure asks for the same turn.
        turn = scope.turn + 1

        fresh: list[ModelResponse] = []

        async def body():
            try:
                response = await self.inner.get_response(
                    system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, **kwargs
                )
            except Exception as e:  # noqa: BLE001 - handed on unchanged below
                raise _ModelCallFailed(e) from e
            fresh.append(response)
            return {
                "output": [item.model_dump(mode="json", exclude_none=True) for item in response.output],
                "response_id": response.response_id,
            }

        failed = None
        try:
            done = await self.owner.runtime.acall(
                self.owner.operation(scope.run_id), turn, "model", MODEL_TOOL, "{}", body
            )
        except _ModelCallFailed as e:
            failed = e.error
        if failed is not None:
            raise failed
        scope.turn = turn
        if fresh and not done.replayed:
            return fresh[-1]
        stored = json.loads(done.result_json)
        return ModelResponse(
            output=_OUTPUT_ITEMS.validate_python(stored["output"]),
            usage=Usage(),  # a recorded response spent nothing now
            response_id=stored.get("response_id"),
        )

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("toolledger: streamed runs are not recorded; use Runner.run")

    async def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            await close()
