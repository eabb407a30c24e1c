//! Streamed responses: chunks in, finished calls out.
//!
//! Every provider that streams tool calls sends a call in pieces: OpenAI Chat
//! as `delta.tool_calls` fragments keyed by `index`, OpenAI Responses as
//! `response.output_item.added` / `response.function_call_arguments.delta` /
//! `…arguments.done` / `response.output_item.done` events, Anthropic as
//! `content_block_start` / `input_json_delta` / `content_block_stop` events,
//! Gemini (with `streamFunctionCallArguments`) as a `functionCall` with
//! `willContinue: true`, then `partialArgs` pieces, then an empty
//! `functionCall`. A piece is never a call: running it would run the tool
//! with half its arguments.
//!
//! [`StreamAssembler`] takes the chunks in order and, once the provider's
//! terminal event has arrived, gives the finished calls — assembled into the
//! document a non-streamed response would have been and read by the same
//! code as [`super::parse_tool_calls`], so streamed and whole responses give
//! the same calls (same ids, same argument text, same refusals). Calls still
//! open when the stream ended are refused with
//! [`ProviderError::IncompleteCall`]; a stream without its terminal event, or
//! ended by the provider's `error` event, gives
//! [`ProviderError::StreamIncomplete`]. A chunk that does not fit the ones
//! before it fails the push with [`ProviderError::StreamMismatch`], and the
//! assembler then refuses everything after (fail closed).
//!
//! A chunk is the JSON payload of one server-sent event (the text after
//! `data:`); OpenAI Chat's final `[DONE]` may be pushed as is. For Gemini a
//! chunk may also be the JSON array a non-SSE `streamGenerateContent` returns.
//! MCP does not stream tool calls and has no assembler.

mod anthropic;
mod chat;
mod gemini;
mod json_path;
mod responses;

use super::error::ProviderError;
use super::json::Json;
use super::{calls_from_document, ParseLimits};
use crate::model::{Provider, ToolCall};

/// Assembles the tool calls of one streamed model response.
///
/// ```
/// use toolledger::model::Provider;
/// use toolledger::provider::{ParseLimits, StreamAssembler};
///
/// let mut stream = StreamAssembler::new(Provider::Anthropic, 0, ParseLimits::default())?;
/// for chunk in [
///     r#"{"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[]}}"#,
///     r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}"#,
///     r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Par"}}"#,
///     r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"is\", \"days\": 2.50}"}}"#,
///     r#"{"type":"content_block_stop","index":0}"#,
///     r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#,
/// ] {
///     stream.push(chunk)?;
///     assert!(!stream.is_complete());
/// }
/// stream.push(r#"{"type":"message_stop"}"#)?;
/// let calls = stream.finish()?;
/// assert_eq!(calls[0].arguments, r#"{"city":"Paris","days":2.50}"#);
/// # Ok::<(), toolledger::provider::ProviderError>(())
/// ```
pub struct StreamAssembler {
    provider: Provider,
    round: u32,
    limits: ParseLimits,
    /// Bytes pushed so far (bounded by `limits.max_bytes`).
    bytes: usize,
    /// Chunks pushed so far (the next chunk's index).
    chunks: usize,
    /// Set when a push failed: everything after is refused.
    failed: bool,
    state: State,
}

/// Shows counts only: the chunks hold argument values.
impl std::fmt::Debug for StreamAssembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamAssembler")
            .field("provider", &self.provider)
            .field("round", &self.round)
            .field("chunks", &self.chunks)
            .field("bytes", &self.bytes)
            .field("failed", &self.failed)
            .field("complete", &self.is_complete())
            .finish()
    }
}

/// The per-provider assembly state.
enum State {
    Chat(chat::ChatStream),
    Responses(responses::ResponsesStream),
    Anthropic(anthropic::AnthropicStream),
    Gemini(gemini::GeminiStream),
}

impl StreamAssembler {
    /// An assembler for one streamed response of `provider`. `round` and
    /// `limits` mean what they mean for [`super::parse_tool_calls`];
    /// `limits.max_bytes` bounds the sum of all chunks.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Unsupported`] for [`Provider::Mcp`] (MCP does not
    /// stream tool calls) and [`Provider::Custom`].
    pub fn new(
        provider: Provider,
        round: u32,
        limits: ParseLimits,
    ) -> Result<StreamAssembler, ProviderError> {
        let state = match provider {
            Provider::OpenAiChat => State::Chat(chat::ChatStream::default()),
            Provider::OpenAiResponses => State::Responses(responses::ResponsesStream::default()),
            Provider::Anthropic => State::Anthropic(anthropic::AnthropicStream::default()),
            Provider::Gemini => State::Gemini(gemini::GeminiStream::default()),
            _ => return Err(ProviderError::Unsupported { provider }),
        };
        Ok(StreamAssembler {
            provider,
            round,
            limits,
            bytes: 0,
            chunks: 0,
            failed: false,
            state,
        })
    }

    /// The provider whose stream this assembles.
    #[must_use]
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// Takes the next chunk of the stream.
    ///
    /// # Errors
    ///
    /// [`ProviderError::TooLarge`] when the chunks together exceed
    /// `limits.max_bytes`, [`ProviderError::InvalidJson`] for a chunk that is
    /// not JSON, [`ProviderError::MissingField`] / [`ProviderError::WrongType`]
    /// for a malformed chunk (paths start with `chunk[n]`),
    /// [`ProviderError::StreamMismatch`] for a chunk that does not fit the
    /// ones before, [`ProviderError::StreamIncomplete`] once a push has
    /// failed. After any error the assembler refuses every further push and
    /// its [`finish`](Self::finish).
    pub fn push(&mut self, chunk_json: &str) -> Result<(), ProviderError> {
        if self.failed {
            return Err(self.refused());
        }
        let outcome = self.push_inner(chunk_json);
        self.chunks += 1;
        if outcome.is_err() {
            self.failed = true;
        }
        outcome
    }

    fn push_inner(&mut self, chunk_json: &str) -> Result<(), ProviderError> {
        let provider = self.provider;
        self.bytes = self.bytes.saturating_add(chunk_json.len());
        if self.bytes > self.limits.max_bytes {
            return Err(ProviderError::TooLarge {
                provider,
                size: self.bytes,
                max: self.limits.max_bytes,
            });
        }
        let at = Chunk {
            provider,
            index: self.chunks,
        };
        if let State::Chat(chat) = &mut self.state {
            if chunk_json.trim() == "[DONE]" {
                return chat.done(&at);
            }
        }
        let root = super::fields::parse_document(provider, chunk_json)?;
        match &mut self.state {
            State::Chat(chat) => chat.push(&at, &root),
            State::Responses(responses) => responses.push(&at, &root),
            State::Anthropic(anthropic) => anthropic.push(&at, &root),
            State::Gemini(gemini) => gemini.push(&at, &root),
        }
    }

    /// True once the provider's terminal event has arrived (Chat: a
    /// `finish_reason`; Responses: `response.completed` or
    /// `response.incomplete`; Anthropic: `message_stop`; Gemini: a
    /// `finishReason`) and no push has failed.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        !self.failed
            && match &self.state {
                State::Chat(chat) => chat.is_complete(),
                State::Responses(responses) => responses.is_complete(),
                State::Anthropic(anthropic) => anthropic.is_complete(),
                State::Gemini(gemini) => gemini.is_complete(),
            }
    }

    /// The finished calls of the stream, in response order, exactly as
    /// [`super::parse_tool_calls`] would give them for the whole response.
    ///
    /// # Errors
    ///
    /// [`ProviderError::StreamIncomplete`] before the terminal event, after
    /// the provider's `error` event or after a failed push;
    /// [`ProviderError::IncompleteCall`] for a call still open at the end;
    /// otherwise the errors of [`super::parse_tool_calls`], with paths into
    /// the assembled response.
    pub fn finish(self) -> Result<Vec<ToolCall>, ProviderError> {
        if self.failed {
            return Err(self.refused());
        }
        let provider = self.provider;
        let document = match self.state {
            State::Chat(chat) => chat.into_document(provider)?,
            State::Responses(responses) => responses.into_document(provider)?,
            State::Anthropic(anthropic) => anthropic.into_document(provider)?,
            State::Gemini(gemini) => gemini.into_document(provider)?,
        };
        calls_from_document(provider, &document, self.round, &self.limits)
    }

    /// The error for any use after a failed push.
    fn refused(&self) -> ProviderError {
        ProviderError::StreamIncomplete {
            provider: self.provider,
            reason: "an earlier chunk was refused",
        }
    }
}

/// Where a chunk came from, for error paths: `chunk[n]`.
pub(super) struct Chunk {
    pub(super) provider: Provider,
    pub(super) index: usize,
}

impl Chunk {
    /// The JSON path of the chunk's root.
    pub(super) fn root(&self) -> String {
        format!("chunk[{}]", self.index)
    }

    /// A [`ProviderError::StreamMismatch`] at `field` of this chunk.
    pub(super) fn mismatch(&self, field: &str, reason: &'static str) -> ProviderError {
        ProviderError::StreamMismatch {
            provider: self.provider,
            chunk: self.index,
            field: field.to_owned(),
            reason,
        }
    }
}

/// A required non-negative integer field (an `index`), kept small.
pub(super) fn index_field(
    provider: Provider,
    obj: &super::fields::Object,
    prefix: &str,
    key: &str,
) -> Result<usize, ProviderError> {
    match super::fields::required(provider, obj, prefix, key)? {
        Json::Number(text) => text.parse::<usize>().ok(),
        _ => None,
    }
    .ok_or_else(|| ProviderError::WrongType {
        provider,
        field: super::fields::key_path(prefix, key),
        expected: "non-negative integer",
    })
}

/// [`ProviderError::StreamIncomplete`] for `provider`.
pub(super) fn incomplete(provider: Provider, reason: &'static str) -> ProviderError {
    ProviderError::StreamIncomplete { provider, reason }
}
