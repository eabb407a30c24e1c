//! Provider wire formats as exported functions: parse a model response into
//! neutral [`ToolCall`]s (whole, or chunk by chunk with `ToolCallStream`),
//! render stored results back into the message the provider expects.

use std::sync::{Arc, Mutex, MutexGuard};

use toolledger_core::provider::{
    self as core, McpProtocol, ParseLimits, StreamAssembler, ToolResultContent,
};

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
/// matters for Gemini calls without an id, which get a derived one. Calls
/// the provider already answered in the response are not returned; a call
/// that is only partly there, or in a Gemini stream chunk before the last
/// (the API's answer to it may still come), is refused, never returned:
/// use `ToolCallStream` for streams.
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

/// Renders the JSON-RPC response answering one MCP `tools/call` request.
/// `protocol_version` is the version the request declared (see
/// `mcp_request_protocol_version`); `None` (a request that named none)
/// renders the shape of the revisions up to 2025-11-25, the bytes
/// [`render_tool_result`] gives. From `2026-07-28` on the result carries
/// `resultType`.
///
/// # Errors
/// `InvalidInput` for a non-MCP call, an unknown protocol version, an
/// `output_json` that is not JSON or a call id that cannot be restored.
#[uniffi::export]
pub fn render_mcp_result(
    call: ToolCall,
    output_json: String,
    is_error: bool,
    protocol_version: Option<String>,
) -> Result<String, LedgerError> {
    let content = ToolResultContent {
        output_json,
        is_error,
    };
    let protocol = match protocol_version {
        None => McpProtocol::V2025_11_25,
        Some(version) => McpProtocol::parse(&version)?,
    };
    Ok(core::render_mcp_result(&call.into(), &content, protocol)?)
}

/// The protocol version an MCP `tools/call` request declares in
/// `params._meta`, or `None` when it declares none (revisions up to
/// 2025-11-25 negotiate the version once, at `initialize`).
///
/// # Errors
/// `InvalidInput` for a malformed request or an unknown version.
#[uniffi::export]
pub fn mcp_request_protocol_version(request_json: String) -> Result<Option<String>, LedgerError> {
    let protocol = McpProtocol::of_request(&request_json, &ParseLimits::default())?;
    Ok(protocol.map(|protocol| protocol.as_str().to_owned()))
}

/// Assembles the tool calls of one streamed model response (OpenAI Chat and
/// Responses, Anthropic, Gemini). Push each event's JSON payload in order;
/// `finish` gives the calls once the provider's terminal event arrived.
/// A call that is still in pieces is never returned.
#[derive(uniffi::Object)]
pub struct ToolCallStream {
    /// Taken by `finish`; `None` afterwards.
    inner: Mutex<Option<StreamAssembler>>,
}

#[uniffi::export]
impl ToolCallStream {
    /// A stream for `provider`; `round` as for `parse_tool_calls`.
    ///
    /// # Errors
    /// `InvalidInput` for `Mcp` (MCP does not stream calls) and `Custom`.
    #[uniffi::constructor]
    pub fn new(provider: Provider, round: u32) -> Result<Arc<ToolCallStream>, LedgerError> {
        let assembler = StreamAssembler::new(provider.into(), round, ParseLimits::default())?;
        Ok(Arc::new(ToolCallStream {
            inner: Mutex::new(Some(assembler)),
        }))
    }

    /// Takes the next chunk: the JSON payload of one server-sent event.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed chunk or one that does not fit the
    /// chunks before it (then every later call fails too), or after `finish`.
    pub fn push(&self, chunk_json: String) -> Result<(), LedgerError> {
        Ok(self
            .assembler()?
            .as_mut()
            .ok_or_else(finished)?
            .push(&chunk_json)?)
    }

    /// True once the provider's terminal event arrived.
    pub fn is_complete(&self) -> bool {
        self.assembler()
            .ok()
            .is_some_and(|inner| inner.as_ref().is_some_and(StreamAssembler::is_complete))
    }

    /// The finished calls, in response order. Can be called once.
    ///
    /// # Errors
    /// `InvalidInput` when the stream is not complete, a call is still open,
    /// a chunk was refused, or `finish` was called before.
    pub fn finish(&self) -> Result<Vec<ToolCall>, LedgerError> {
        let assembler = self.assembler()?.take().ok_or_else(finished)?;
        Ok(assembler.finish()?.into_iter().map(Into::into).collect())
    }
}

impl ToolCallStream {
    /// The assembler slot; a poisoned lock is an internal error.
    fn assembler(&self) -> Result<MutexGuard<'_, Option<StreamAssembler>>, LedgerError> {
        self.inner.lock().map_err(|_| LedgerError::Internal {
            message: "tool call stream lock poisoned".to_owned(),
        })
    }
}

/// The error for a stream used after `finish`.
fn finished() -> LedgerError {
    LedgerError::InvalidInput {
        message: "the tool call stream was already finished".to_owned(),
    }
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

type TurnRenderer = fn(
    &[(&toolledger_core::model::ToolCall, &ToolResultContent)],
) -> Result<String, core::ProviderError>;

fn render_turn(results: Vec<ToolResult>, render: TurnRenderer) -> Result<String, LedgerError> {
    let owned: Vec<(toolledger_core::model::ToolCall, ToolResultContent)> = results
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

#[cfg(test)]
mod tests {
    use super::*;

    const MCP_2026: &str = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"f",
        "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;

    #[test]
    fn stream_finishes_once() {
        let stream = ToolCallStream::new(Provider::Anthropic, 1).unwrap();
        for chunk in [
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"n\":-0}"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
        ] {
            stream.push(chunk.to_owned()).unwrap();
        }
        assert!(!stream.is_complete());
        stream
            .push(r#"{"type":"message_stop"}"#.to_owned())
            .unwrap();
        assert!(stream.is_complete());
        let calls = stream.finish().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments, r#"{"n":-0}"#);
        assert!(matches!(
            stream.finish(),
            Err(LedgerError::InvalidInput { .. })
        ));
        assert!(matches!(
            stream.push("{}".to_owned()),
            Err(LedgerError::InvalidInput { .. })
        ));
        assert!(!stream.is_complete());
    }

    #[test]
    fn mcp_has_no_stream() {
        assert!(matches!(
            ToolCallStream::new(Provider::Mcp, 0),
            Err(LedgerError::InvalidInput { .. })
        ));
    }

    #[test]
    fn mcp_results_render_by_version() {
        assert_eq!(
            mcp_request_protocol_version(MCP_2026.to_owned()).unwrap(),
            Some("2026-07-28".to_owned())
        );
        let call = parse_tool_calls(Provider::Mcp, MCP_2026.to_owned(), 0)
            .unwrap()
            .remove(0);
        let with = render_mcp_result(
            call.clone(),
            "1".to_owned(),
            false,
            Some("2026-07-28".to_owned()),
        )
        .unwrap();
        assert_eq!(
            with,
            r#"{"jsonrpc":"2.0","id":5,"result":{"resultType":"complete","content":[{"type":"text","text":"1"}],"isError":false}}"#
        );
        let without = render_mcp_result(call.clone(), "1".to_owned(), false, None).unwrap();
        assert_eq!(
            without,
            render_tool_result(call.clone(), "1".to_owned(), false).unwrap()
        );
        assert!(matches!(
            render_mcp_result(call, "1".to_owned(), false, Some("1999-01-01".to_owned())),
            Err(LedgerError::InvalidInput { .. })
        ));
        let chat = parse_tool_calls(
            Provider::OpenAiChat,
            r#"{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}"#.to_owned(),
            0,
        )
        .unwrap()
        .remove(0);
        assert!(matches!(
            render_mcp_result(chat, "1".to_owned(), false, None),
            Err(LedgerError::InvalidInput { .. })
        ));
    }
}
