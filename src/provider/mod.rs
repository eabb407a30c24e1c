//! Provider wire formats: tool calls in, tool results out.
//!
//! This is the only place that knows what OpenAI (Chat Completions and
//! Responses), Anthropic Messages, Gemini `generateContent` and MCP `tools/call`
//! look like on the wire. [`parse_tool_calls`] turns the tool calls of one model
//! response into neutral [`ToolCall`]s before anything is recorded in the
//! ledger; [`StreamAssembler`] does the same for a streamed response, chunk by
//! chunk; [`render_tool_result`] (and the whole-turn helpers) turn a stored
//! result back into the message that provider expects. `docs/providers.md`
//! lists, per provider, which response items are client calls, which are
//! skipped and which are refused.
//!
//! Four properties matter to the ledger:
//!
//! * **All-or-nothing parsing.** If any call of a response is malformed the
//!   whole parse fails, so a half-understood response never gets recorded.
//!   Responses are size-checked *before* parsing ([`ParseLimits`]); nesting depth
//!   is bounded at 128.
//! * **Only the client's calls, only whole calls.** A call the provider
//!   already ran (answered in the same response) is skipped; a call that is
//!   not complete (a streamed fragment, an item still in progress, a call cut
//!   off at the token limit) is refused with [`ProviderError::IncompleteCall`],
//!   never returned with missing arguments.
//! * **Values unchanged.** Arguments are returned as compact JSON text of an
//!   object, members sorted by key, every number exactly as the provider sent
//!   it (no rounding through binary floating point, `-0` stays `-0`); results
//!   are rendered with every number exactly as stored. Duplicate object keys
//!   anywhere in a response, in string-encoded arguments or in a stored result
//!   are rejected rather than collapsed.
//! * **Deterministic rendering.** The same call and the same stored result
//!   always render byte-identical JSON, so a replay delivers exactly what the
//!   first delivery did. Result JSON is re-written compactly (object keys
//!   sorted), which also makes rendering insensitive to whitespace in the
//!   stored text.
//!
//! Errors name the provider and the JSON path of the problem, never argument
//! or result values (see [`ProviderError`]).

mod anthropic;
mod error;
mod fields;
mod gemini;
mod json;
mod mcp;
mod openai;
mod responses;
mod stream;
mod strict;

use std::collections::HashMap;

pub use error::{ProviderError, MAX_TAG_CHARS};
pub use mcp::McpProtocol;
pub use stream::StreamAssembler;

use crate::model::{Provider, ToolCall};
use fields::{Output, RawCall};
use json::Json;

/// Default for [`ParseLimits::max_bytes`]: 4 MiB.
pub const DEFAULT_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Default for [`ParseLimits::max_calls`].
pub const DEFAULT_MAX_CALLS: usize = 128;

/// Bounds applied to an untrusted model response before and while parsing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseLimits {
    /// Largest response accepted, in bytes; checked before any parsing.
    pub max_bytes: usize,
    /// Most tool calls accepted from one response.
    pub max_calls: usize,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_calls: DEFAULT_MAX_CALLS,
        }
    }
}

/// A tool's stored result, as handed to the renderers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResultContent {
    /// The tool's result JSON as stored in the ledger (any JSON value; a JSON
    /// string is delivered to text-only providers as its contents).
    pub output_json: String,
    /// True when the tool failed and `output_json` describes the failure.
    pub is_error: bool,
}

/// Parses the tool calls of one model response, in response order.
///
/// `position` of each call is its index among the tool calls of the response
/// (from 0; text, reasoning and other non-call items are not counted). `round`
/// is the orchestration round of the response; it only matters for Gemini
/// calls without an id, which get the derived id `gemini_r{round}_p{position}`
/// (`call_id_derived = true`). A response without tool calls gives an empty
/// vector.
///
/// Accepted documents: OpenAI Chat — a completion object (`choices[0]` is
/// read) or a bare assistant `message`; OpenAI Responses — a response object
/// (`output[]`); Anthropic — a message object (`content[]`); Gemini — a
/// `generateContent` response (`candidates[0]`); MCP — one JSON-RPC
/// `tools/call` request or a batch array of them. For MCP the call id is the
/// JSON text of the request id: `7` for the number 7, `"req-7"` (with the
/// quotes) for the string `req-7`, so that results can restore its type.
///
/// Calls the provider already answered in the same response are not
/// returned. For OpenAI Responses, the tool name of a call made inside a
/// `namespace` is `namespace.name`. A document that is one chunk of a stream
/// is parsed as a whole response: a call it holds only in part is refused
/// with [`ProviderError::IncompleteCall`], never returned, and so is any
/// call of a Gemini candidate without `finishReason` (the model had not
/// stopped: the API's answer to it may come in a later chunk). Use
/// [`StreamAssembler`] for streams.
///
/// # Errors
///
/// * [`ProviderError::Unsupported`] for [`Provider::Custom`];
/// * [`ProviderError::TooLarge`] when `response_json` exceeds
///   `limits.max_bytes` (checked before parsing);
/// * [`ProviderError::InvalidJson`] when it is not JSON (or nests too deep);
/// * [`ProviderError::TooManyCalls`] when it holds more than
///   `limits.max_calls` calls;
/// * [`ProviderError::MissingField`], [`ProviderError::WrongType`],
///   [`ProviderError::ArgumentsNotJson`], [`ProviderError::UnknownBlockType`],
///   [`ProviderError::UnsupportedMethod`] naming the first malformed field;
/// * [`ProviderError::IncompleteCall`] for a call that is not complete;
/// * [`ProviderError::UnansweredServerCall`] for a Gemini call left
///   unanswered of a tool the API answered in the same turn;
/// * [`ProviderError::UnsupportedProtocolVersion`] for an MCP request that
///   declares a protocol version this module does not know;
/// * [`ProviderError::DuplicateCallId`] when two calls share an id.
pub fn parse_tool_calls(
    provider: Provider,
    response_json: &str,
    round: u32,
    limits: &ParseLimits,
) -> Result<Vec<ToolCall>, ProviderError> {
    let root = parse_root(provider, response_json, limits)?;
    calls_from_document(provider, &root, round, limits)
}

/// Size-checks and parses a document for `provider`.
fn parse_root(
    provider: Provider,
    response_json: &str,
    limits: &ParseLimits,
) -> Result<Json, ProviderError> {
    if provider == Provider::Custom {
        return Err(ProviderError::Unsupported { provider });
    }
    if response_json.len() > limits.max_bytes {
        return Err(ProviderError::TooLarge {
            provider,
            size: response_json.len(),
            max: limits.max_bytes,
        });
    }
    fields::parse_document(provider, response_json)
}

/// The client's calls in a parsed document (a response, or a stream's
/// assembled equivalent).
fn calls_from_document(
    provider: Provider,
    root: &Json,
    round: u32,
    limits: &ParseLimits,
) -> Result<Vec<ToolCall>, ProviderError> {
    let raw = match provider {
        Provider::OpenAiChat => openai::locate_chat(root)?,
        Provider::OpenAiResponses => responses::locate(root)?,
        Provider::Anthropic => anthropic::locate(root)?,
        Provider::Gemini => gemini::locate(root)?,
        Provider::Mcp => mcp::locate(root)?,
        Provider::Custom => return Err(ProviderError::Unsupported { provider }),
    };
    if raw.len() > limits.max_calls {
        return Err(ProviderError::TooManyCalls {
            provider,
            count: raw.len(),
            max: limits.max_calls,
        });
    }
    let mut calls = Vec::with_capacity(raw.len());
    for (index, item) in raw.iter().enumerate() {
        let position = u32::try_from(index).map_err(|_| ProviderError::TooManyCalls {
            provider,
            count: raw.len(),
            max: limits.max_calls,
        })?;
        calls.push(convert(provider, item, position, round)?);
    }
    check_unique_ids(provider, &calls)?;
    Ok(calls)
}

/// Converts one located call item with the provider's converter.
fn convert(
    provider: Provider,
    raw: &RawCall<'_>,
    position: u32,
    round: u32,
) -> Result<ToolCall, ProviderError> {
    match provider {
        Provider::OpenAiChat => openai::convert_chat(raw, position),
        Provider::OpenAiResponses => responses::convert(raw, position),
        Provider::Anthropic => anthropic::convert(raw, position),
        Provider::Gemini => gemini::convert(raw, position, round),
        Provider::Mcp => mcp::convert(raw, position),
        Provider::Custom => Err(ProviderError::Unsupported { provider }),
    }
}

/// Fails when two calls of one response share a call id.
fn check_unique_ids(provider: Provider, calls: &[ToolCall]) -> Result<(), ProviderError> {
    let mut seen: HashMap<&str, u32> = HashMap::with_capacity(calls.len());
    for call in calls {
        if let Some(&first) = seen.get(call.call_id.as_str()) {
            return Err(ProviderError::DuplicateCallId {
                provider,
                first,
                second: call.position,
            });
        }
        seen.insert(&call.call_id, call.position);
    }
    Ok(())
}

/// Renders one tool result as the message (or block) `call.provider` expects,
/// as compact JSON.
///
/// * OpenAI Chat: `{"role":"tool","tool_call_id":…,"content":"…"}`;
/// * OpenAI Responses: `{"type":"function_call_output","call_id":…,"output":"…"}`
///   (with `"name"` and `"namespace"` before `"output"` for a call whose tool
///   name is `namespace.name`);
/// * Anthropic: one `{"type":"tool_result","tool_use_id":…,"content":"…"}`
///   block, with `"is_error":true` appended only for failures (send all blocks
///   of a response with [`render_anthropic_user_message`]);
/// * Gemini: one `{"functionResponse":{"id"?,"name","response"}}` part (`id`
///   only for a provider-given id; see [`render_gemini_user_turn`]);
/// * MCP: a JSON-RPC response carrying a `CallToolResult` in the shape of the
///   revisions up to 2025-11-25; for a request that declared its version use
///   [`render_mcp_result`].
///
/// Text content is the stored result's string value when it is a JSON
/// string, otherwise its compact JSON text. Every number is written exactly
/// as stored. OpenAI formats have no error flag: the stored output itself
/// must describe the failure. The output is deterministic: the same call and
/// result always give the same bytes.
///
/// # Errors
///
/// [`ProviderError::ResultNotJson`] when `result.output_json` is not JSON,
/// [`ProviderError::InvalidCallId`] for an MCP call id that is not the JSON
/// text of a string or number, [`ProviderError::Unsupported`] for
/// [`Provider::Custom`].
pub fn render_tool_result(
    call: &ToolCall,
    result: &ToolResultContent,
) -> Result<String, ProviderError> {
    let provider = call.provider;
    if provider == Provider::Custom {
        return Err(ProviderError::Unsupported { provider });
    }
    let output = Output::parse(provider, result)?;
    Ok(match provider {
        Provider::OpenAiChat => openai::render_chat(call, &output),
        Provider::OpenAiResponses => responses::render(call, &output),
        Provider::Anthropic => anthropic::block(call, &output).to_text(),
        Provider::Gemini => gemini::part(call, &output).to_text(),
        Provider::Mcp => mcp::response(call, &output, McpProtocol::V2025_11_25)?.to_text(),
        Provider::Custom => return Err(ProviderError::Unsupported { provider }),
    })
}

/// Renders the JSON-RPC response answering one MCP `tools/call` request made
/// under `protocol` (see [`McpProtocol::of_request`] for the version a request
/// declares). From 2026-07-28 on the result carries
/// `"resultType":"complete"` first; otherwise the bytes are those of
/// [`render_tool_result`].
///
/// # Errors
///
/// [`ProviderError::ProviderMismatch`] for a non-MCP call,
/// [`ProviderError::ResultNotJson`] when `result.output_json` is not JSON,
/// [`ProviderError::InvalidCallId`] for a call id that cannot be restored.
pub fn render_mcp_result(
    call: &ToolCall,
    result: &ToolResultContent,
    protocol: McpProtocol,
) -> Result<String, ProviderError> {
    if call.provider != Provider::Mcp {
        return Err(ProviderError::ProviderMismatch {
            expected: Provider::Mcp,
            found: call.provider,
        });
    }
    let output = Output::parse(Provider::Mcp, result)?;
    Ok(mcp::response(call, &output, protocol)?.to_text())
}

/// Renders the Anthropic user message answering one response:
/// `{"role":"user","content":[…tool_result blocks…]}`.
///
/// Anthropic requires every `tool_result` of a response in one user message,
/// ahead of any other content. Blocks are ordered by call position (stably),
/// whatever order the results are handed in.
///
/// # Errors
///
/// [`ProviderError::NoResults`] for an empty slice,
/// [`ProviderError::ProviderMismatch`] for a non-Anthropic call,
/// [`ProviderError::ResultNotJson`] for a result that is not JSON.
pub fn render_anthropic_user_message(
    calls_and_results: &[(&ToolCall, &ToolResultContent)],
) -> Result<String, ProviderError> {
    let provider = Provider::Anthropic;
    let parsed = turn_outputs(provider, calls_and_results)?;
    let blocks = parsed
        .iter()
        .map(|(call, output)| anthropic::block(call, output))
        .collect();
    Ok(user_turn("content", blocks))
}

/// Renders the Gemini content answering one response:
/// `{"role":"user","parts":[…functionResponse parts…]}`.
///
/// Gemini's current documentation sends function responses in a content of
/// role `user` (the older `function` role is not used), one part per call, in
/// call position order.
///
/// # Errors
///
/// [`ProviderError::NoResults`] for an empty slice,
/// [`ProviderError::ProviderMismatch`] for a non-Gemini call,
/// [`ProviderError::ResultNotJson`] for a result that is not JSON.
pub fn render_gemini_user_turn(
    calls_and_results: &[(&ToolCall, &ToolResultContent)],
) -> Result<String, ProviderError> {
    let provider = Provider::Gemini;
    let parsed = turn_outputs(provider, calls_and_results)?;
    let parts = parsed
        .iter()
        .map(|(call, output)| gemini::part(call, output))
        .collect();
    Ok(user_turn("parts", parts))
}

/// Renders the JSON-RPC batch response answering an MCP batch request: an
/// array of responses in call position order. (Batches exist only in the
/// revisions up to 2025-03-26, so no `resultType` is written.)
///
/// # Errors
///
/// [`ProviderError::NoResults`] for an empty slice,
/// [`ProviderError::ProviderMismatch`] for a non-MCP call,
/// [`ProviderError::ResultNotJson`] for a result that is not JSON,
/// [`ProviderError::InvalidCallId`] for an id that cannot be restored.
pub fn render_mcp_batch_response(
    calls_and_results: &[(&ToolCall, &ToolResultContent)],
) -> Result<String, ProviderError> {
    let provider = Provider::Mcp;
    let parsed = turn_outputs(provider, calls_and_results)?;
    let responses = parsed
        .iter()
        .map(|(call, output)| mcp::response(call, output, McpProtocol::V2025_03_26))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json::Array(responses).to_text())
}

/// Checks and parses the results of one turn, ordered by call position.
fn turn_outputs<'a>(
    provider: Provider,
    calls_and_results: &[(&'a ToolCall, &ToolResultContent)],
) -> Result<Vec<(&'a ToolCall, Output)>, ProviderError> {
    if calls_and_results.is_empty() {
        return Err(ProviderError::NoResults { provider });
    }
    let mut parsed = Vec::with_capacity(calls_and_results.len());
    for &(call, result) in calls_and_results {
        if call.provider != provider {
            return Err(ProviderError::ProviderMismatch {
                expected: provider,
                found: call.provider,
            });
        }
        parsed.push((call, Output::parse(provider, result)?));
    }
    parsed.sort_by_key(|(call, _)| call.position);
    Ok(parsed)
}

/// `{"role":"user","<key>":[…]}`: an Anthropic user message (`content`) or a
/// Gemini user content (`parts`).
fn user_turn(key: &str, items: Vec<Json>) -> String {
    Json::object([("role", Json::str("user")), (key, Json::Array(items))]).to_text()
}

#[cfg(test)]
mod tests;
