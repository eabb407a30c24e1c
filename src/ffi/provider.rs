//! Provider wire formats as exported functions: parse a model response into
//! neutral [`ToolCall`]s, render stored results back into the message the
//! provider expects.

use crate::provider::{self as core, ParseLimits, ToolResultContent};

use super::error::LedgerError;
use super::records::{Provider, ToolCall};

/// One call with its result, for the whole-turn renderers.
// No `Debug`: it holds argument or result values, which are never logged.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
pub struct ToolResult {
    /// The call the result answers.
    pub call: ToolCall,
    /// The tool's result JSON as stored (a JSON string is delivered to
    /// text-only providers as its contents).
    pub output_json: String,
    /// True when the tool failed and `output_json` describes the failure.
    #[uniffi(default = false)]
    pub is_error: bool,
}

/// Parses the tool calls of one model response, in response order
/// (all-or-nothing: one malformed call fails the whole parse). `round` only
/// matters for Gemini calls without an id, which get a derived one.
///
/// # Errors
/// `InvalidInput` naming the provider and the JSON path of the problem (never
/// argument values); `Custom` has no wire format.
#[uniffi::export]
pub fn parse_tool_calls(
    provider: Provider,
    response_json: String,
    round: u32,
) -> Result<Vec<ToolCall>, LedgerError> {
    let calls = core::parse_tool_calls(
        provider.into(),
        &response_json,
        round,
        &ParseLimits::default(),
    )?;
    Ok(calls.into_iter().map(Into::into).collect())
}

/// Renders one tool result as the message (or block) `call.provider`
/// expects, as compact JSON. Deterministic: the same call and result always
/// give the same bytes, so a replay delivers exactly what the first did.
///
/// # Errors
/// `InvalidInput` when `output_json` is not JSON, for an MCP call id that
/// cannot be restored, or for `Custom`.
#[uniffi::export]
pub fn render_tool_result(
    call: ToolCall,
    output_json: String,
    is_error: bool,
) -> Result<String, LedgerError> {
    let content = ToolResultContent {
        output_json,
        is_error,
    };
    Ok(core::render_tool_result(&call.into(), &content)?)
}

/// Renders the Anthropic user message answering one response: every
/// `tool_result` block, in call position order.
///
/// # Errors
/// `InvalidInput` for no results, a non-Anthropic call or a result that is
/// not JSON.
#[uniffi::export]
pub fn render_anthropic_user_message(results: Vec<ToolResult>) -> Result<String, LedgerError> {
    render_turn(results, core::render_anthropic_user_message)
}

/// Renders the Gemini content answering one response: one
/// `functionResponse` part per call, in call position order.
///
/// # Errors
/// `InvalidInput` for no results, a non-Gemini call or a result that is not
/// JSON.
#[uniffi::export]
pub fn render_gemini_user_turn(results: Vec<ToolResult>) -> Result<String, LedgerError> {
    render_turn(results, core::render_gemini_user_turn)
}

/// Renders the JSON-RPC batch response answering an MCP batch request.
///
/// # Errors
/// `InvalidInput` for no results, a non-MCP call, a result that is not JSON
/// or an id that cannot be restored.
#[uniffi::export]
pub fn render_mcp_batch_response(results: Vec<ToolResult>) -> Result<String, LedgerError> {
    render_turn(results, core::render_mcp_batch_response)
}

type TurnRenderer =
    fn(&[(&crate::model::ToolCall, &ToolResultContent)]) -> Result<String, core::ProviderError>;

fn render_turn(results: Vec<ToolResult>, render: TurnRenderer) -> Result<String, LedgerError> {
    let owned: Vec<(crate::model::ToolCall, ToolResultContent)> = results
        .into_iter()
        .map(|r| {
            (
                r.call.into(),
                ToolResultContent {
                    output_json: r.output_json,
                    is_error: r.is_error,
                },
            )
        })
        .collect();
    let borrowed: Vec<_> = owned.iter().map(|(c, r)| (c, r)).collect();
    Ok(render(&borrowed)?)
}
