//! The one error type of the provider module.
//!
//! Every variant names the provider and, where there is one, the JSON path of the
//! offending field (`choices[0].message.tool_calls[1].function.name`). No variant
//! ever carries an argument or result *value*: tool arguments are user data (mail
//! bodies, addresses, calendar entries) and errors end up in logs and crash
//! reports. The only strings copied from the input are structural tags (a block
//! `type`, a JSON-RPC `method`), clipped to [`MAX_TAG_CHARS`] characters.

use crate::model::Provider;

/// The longest structural tag (block type, method name) an error repeats.
pub const MAX_TAG_CHARS: usize = 64;

/// Why a provider response could not be parsed, or a result not rendered.
///
/// Parsing is all-or-nothing: when any call of a response is malformed, the whole
/// parse fails with the first problem found, in document order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The response (or a result) is not syntactically valid JSON.
    #[error("{provider}: response is not valid JSON: {reason}")]
    InvalidJson {
        /// The provider whose format was expected.
        provider: Provider,
        /// The parser's description (position and kind, never content).
        reason: String,
    },
    /// A required field is absent (or `null`).
    #[error("{provider}: missing field `{field}`")]
    MissingField {
        /// The provider whose format was expected.
        provider: Provider,
        /// The JSON path of the missing field.
        field: String,
    },
    /// A field is present but of the wrong JSON type (or an empty string where
    /// a non-empty one is required).
    #[error("{provider}: field `{field}` has the wrong type: expected {expected}")]
    WrongType {
        /// The provider whose format was expected.
        provider: Provider,
        /// The JSON path of the field (`$` for the document root).
        field: String,
        /// What the field should have been.
        expected: &'static str,
    },
    /// A string-encoded arguments field does not parse as JSON.
    #[error("{provider}: arguments at `{field}` are not valid JSON: {reason}")]
    ArgumentsNotJson {
        /// The provider whose format was expected.
        provider: Provider,
        /// The JSON path of the arguments field.
        field: String,
        /// The parser's description (position and kind, never content).
        reason: String,
    },
    /// A content block / output item / tool call has a `type` this module does
    /// not know, so it cannot tell whether it is a call that must be executed.
    #[error("{provider}: unknown type `{block_type}` at `{field}`")]
    UnknownBlockType {
        /// The provider whose format was expected.
        provider: Provider,
        /// The JSON path of the block.
        field: String,
        /// The block's `type` tag (clipped).
        block_type: String,
    },
    /// An MCP JSON-RPC message is not a `tools/call` request.
    #[error("{provider}: unsupported method `{method}` at `{field}`")]
    UnsupportedMethod {
        /// The provider whose format was expected.
        provider: Provider,
        /// The JSON path of the `method` field.
        field: String,
        /// The method name found (clipped).
        method: String,
    },
    /// Two calls of one response share a call id, so results could not be
    /// correlated.
    #[error("{provider}: calls at positions {first} and {second} share one call id")]
    DuplicateCallId {
        /// The provider whose format was expected.
        provider: Provider,
        /// Position of the first call with the id.
        first: u32,
        /// Position of the later call with the same id.
        second: u32,
    },
    /// The response is larger than [`super::ParseLimits::max_bytes`]; it was not
    /// parsed.
    #[error("{provider}: response of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// The provider whose format was expected.
        provider: Provider,
        /// The response size in bytes.
        size: usize,
        /// The configured limit.
        max: usize,
    },
    /// The response holds more tool calls than [`super::ParseLimits::max_calls`].
    #[error("{provider}: response has {count} tool calls, more than the limit of {max}")]
    TooManyCalls {
        /// The provider whose format was expected.
        provider: Provider,
        /// The number of tool calls found.
        count: usize,
        /// The configured limit.
        max: usize,
    },
    /// The provider has no wire format here ([`Provider::Custom`]).
    #[error("{provider}: no wire format for this provider")]
    Unsupported {
        /// The provider asked for.
        provider: Provider,
    },
    /// A stored tool result is not valid JSON.
    #[error("{provider}: stored tool result is not valid JSON: {reason}")]
    ResultNotJson {
        /// The provider the result was to be rendered for.
        provider: Provider,
        /// The parser's description (position and kind, never content).
        reason: String,
    },
    /// A call id cannot be rendered for this provider (an MCP call id that is
    /// not the JSON text of a string or number id).
    #[error("{provider}: call id cannot be rendered as this provider's id")]
    InvalidCallId {
        /// The provider the result was to be rendered for.
        provider: Provider,
    },
    /// A whole-turn renderer was handed a call of another provider.
    #[error("expected a call from {expected}, got one from {found}")]
    ProviderMismatch {
        /// The provider the renderer is for.
        expected: Provider,
        /// The provider of the call handed in.
        found: Provider,
    },
    /// A whole-turn renderer was handed no results (providers reject empty
    /// turns).
    #[error("{provider}: no tool results to render")]
    NoResults {
        /// The provider the renderer is for.
        provider: Provider,
    },
    /// A call is not complete: a streamed fragment (Gemini `willContinue` or
    /// `partialArgs`), a function call whose item is still `in_progress` or
    /// `incomplete` (OpenAI Responses), a call in a Gemini candidate without
    /// `finishReason` (a stream chunk: the model has not stopped), or the
    /// last call of a response cut off at the token limit. It is never returned as runnable; assemble
    /// the stream with [`super::StreamAssembler`] instead.
    #[error("{provider}: the call at `{field}` is incomplete and cannot be run")]
    IncompleteCall {
        /// The provider whose format was expected.
        provider: Provider,
        /// The JSON path of the incomplete call.
        field: String,
    },
    /// A call is left without an answer in a response where the provider
    /// ran the same tool itself and answered it (Gemini with server-side
    /// MCP tools): it may be the provider's own call whose answer is
    /// missing as well as a call for the client, so it is neither run nor
    /// dropped. The whole response is refused.
    #[error("{provider}: the call at `{field}` names a tool the provider ran itself in this response, and has no answer")]
    UnansweredServerCall {
        /// The provider whose format was expected.
        provider: Provider,
        /// The JSON path of the unanswered call.
        field: String,
    },
    /// A stream was finished before its provider's terminal event, or the
    /// provider ended it with an error: nothing in it is runnable.
    #[error("{provider}: the stream is not complete: {reason}")]
    StreamIncomplete {
        /// The provider whose stream was assembled.
        provider: Provider,
        /// Why (a fixed text).
        reason: &'static str,
    },
    /// A stream chunk does not fit the chunks before it (a fragment for a
    /// call that was never started, an id or name that changes, a value for
    /// a path that already has one, content after the terminal event).
    #[error("{provider}: stream chunk {chunk}, `{field}`: {reason}")]
    StreamMismatch {
        /// The provider whose stream was assembled.
        provider: Provider,
        /// Index of the chunk (from 0) in the order it was pushed.
        chunk: usize,
        /// The JSON path inside the chunk.
        field: String,
        /// What does not fit (a fixed text).
        reason: &'static str,
    },
    /// An MCP request or render asked for a protocol version whose result
    /// shape this module has not been checked against.
    #[error("{provider}: unsupported protocol version `{version}`")]
    UnsupportedProtocolVersion {
        /// The provider (MCP).
        provider: Provider,
        /// The version string (clipped).
        version: String,
    },
    /// Serialising the rendered message failed (not expected to happen).
    #[error("{provider}: could not serialise the rendered message")]
    RenderFailed {
        /// The provider the result was to be rendered for.
        provider: Provider,
    },
}

impl ProviderError {
    /// The provider the error is about (for a [`ProviderError::ProviderMismatch`],
    /// the one the renderer expected).
    #[must_use]
    pub fn provider(&self) -> Provider {
        match self {
            ProviderError::InvalidJson { provider, .. }
            | ProviderError::MissingField { provider, .. }
            | ProviderError::WrongType { provider, .. }
            | ProviderError::ArgumentsNotJson { provider, .. }
            | ProviderError::UnknownBlockType { provider, .. }
            | ProviderError::UnsupportedMethod { provider, .. }
            | ProviderError::DuplicateCallId { provider, .. }
            | ProviderError::TooLarge { provider, .. }
            | ProviderError::TooManyCalls { provider, .. }
            | ProviderError::Unsupported { provider }
            | ProviderError::ResultNotJson { provider, .. }
            | ProviderError::InvalidCallId { provider }
            | ProviderError::NoResults { provider }
            | ProviderError::IncompleteCall { provider, .. }
            | ProviderError::UnansweredServerCall { provider, .. }
            | ProviderError::StreamIncomplete { provider, .. }
            | ProviderError::StreamMismatch { provider, .. }
            | ProviderError::UnsupportedProtocolVersion { provider, .. }
            | ProviderError::RenderFailed { provider } => *provider,
            ProviderError::ProviderMismatch { expected, .. } => *expected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_provider_and_field() {
        let err = ProviderError::MissingField {
            provider: Provider::OpenAiChat,
            field: "choices[0].message.tool_calls[1].function.name".into(),
        };
        assert_eq!(
            err.to_string(),
            "openai_chat: missing field `choices[0].message.tool_calls[1].function.name`"
        );
        assert_eq!(err.provider(), Provider::OpenAiChat);
        let mismatch = ProviderError::ProviderMismatch {
            expected: Provider::Anthropic,
            found: Provider::Gemini,
        };
        assert_eq!(
            mismatch.to_string(),
            "expected a call from anthropic, got one from gemini"
        );
        assert_eq!(mismatch.provider(), Provider::Anthropic);
    }
}
