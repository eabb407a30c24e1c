//! The provider-neutral tool call: what one model response asked for.
//!
//! Every provider format (OpenAI, Anthropic, Gemini, MCP) is parsed into this one
//! shape by `crate::provider`; the ledger and the executor only ever see a
//! [`ToolCall`]. The provider's own call id is correlation metadata: the ledger's
//! identity ([`crate::model::ExecutionId`]) is built by the app from trusted
//! orchestration state, of which the call id is one component.

use std::fmt;

/// The model provider (or protocol) a tool call came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// OpenAI Chat Completions (`choices[].message.tool_calls`).
    OpenAiChat,
    /// OpenAI Responses API (`output[]` items of type `function_call`).
    OpenAiResponses,
    /// Anthropic Messages (`content[]` blocks of type `tool_use`).
    Anthropic,
    /// Google Gemini (`candidates[].content.parts[].functionCall`).
    Gemini,
    /// Model Context Protocol `tools/call` JSON-RPC requests.
    Mcp,
    /// A call built by the app itself (tests, scripted tools, the demo).
    Custom,
}

impl Provider {
    /// The stable lowercase label stored in the ledger and shown in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAiChat => "openai_chat",
            Provider::OpenAiResponses => "openai_responses",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
            Provider::Mcp => "mcp",
            Provider::Custom => "custom",
        }
    }

    /// Parses a label written by [`Provider::as_str`].
    pub fn parse(label: &str) -> Option<Provider> {
        Some(match label {
            "openai_chat" => Provider::OpenAiChat,
            "openai_responses" => Provider::OpenAiResponses,
            "anthropic" => Provider::Anthropic,
            "gemini" => Provider::Gemini,
            "mcp" => Provider::Mcp,
            "custom" => Provider::Custom,
            _ => return None,
        })
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tool call the model asked for, in neutral form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Where the call came from.
    pub provider: Provider,
    /// The provider's call id (`call_…`, `toolu_…`, an MCP request id), or one
    /// derived from round and position when the provider gave none.
    pub call_id: String,
    /// True when `call_id` was derived because the provider sent no id.
    pub call_id_derived: bool,
    /// The tool (function) name the model chose.
    pub tool_name: String,
    /// The arguments as JSON text (an object for every provider we parse).
    pub arguments: String,
    /// Position of the call within its model response, from 0.
    pub position: u32,
}

impl ToolCall {
    /// A call built by the app itself (provider [`Provider::Custom`]).
    pub fn custom(
        call_id: impl Into<String>,
        tool_name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> ToolCall {
        ToolCall {
            provider: Provider::Custom,
            call_id: call_id.into(),
            call_id_derived: false,
            tool_name: tool_name.into(),
            arguments: arguments.into(),
            position: 0,
        }
    }
}
