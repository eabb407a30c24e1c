//! Anthropic Messages streams: content-block events.
//!
//! `message_start` carries the message (its `content` normally empty);
//! `content_block_start` opens the block at `index` (a `tool_use` block
//! starts with `input: {}`); `input_json_delta` events append
//! `partial_json` pieces to a block's input text; `content_block_stop` closes
//! the block, and a `tool_use` block's input becomes the parsed text (an
//! empty text keeps the start's input). `message_delta` carries the
//! `stop_reason`; `message_stop` ends the stream, an `error` event ends it
//! unusable. Text, thinking, signature and citation deltas carry nothing
//! this module reads. A delta of any other type on a `tool_use` block is
//! refused, since it might change the call's input; other unknown events are
//! ignored, as Anthropic asks of clients. A `tool_use` block that never got
//! its `content_block_stop` is refused with `IncompleteCall`.

use std::collections::BTreeMap;

use super::super::error::ProviderError;
use super::super::fields::{
    as_object, index_path, json_reason, key_path, optional_array, optional_object, optional_str,
    required_object, required_str, Object,
};
use super::super::json::Json;
use super::{incomplete, index_field, Chunk};
use crate::model::Provider;

/// Delta types that never change a call.
const TEXT_DELTAS: &[&str] = &[
    "text_delta",
    "thinking_delta",
    "signature_delta",
    "citations_delta",
];

/// One content block being assembled.
struct Block {
    block: Object,
    /// The concatenated `partial_json` pieces.
    input_text: String,
    stopped: bool,
    /// The input text did not parse at the block's stop: refused at the
    /// end, as `IncompleteCall` when the stop reason says the output was
    /// cut (`max_tokens`), as `ArgumentsNotJson` otherwise.
    input_error: Option<ProviderError>,
}

impl Block {
    fn is_call(&self) -> bool {
        self.block.get("type").and_then(Json::as_str) == Some("tool_use")
    }
}

/// How the stream ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    Stopped,
    Failed,
}

/// The state of one Messages stream.
pub(super) struct AnthropicStream {
    blocks: BTreeMap<usize, Block>,
    stop_reason: Option<String>,
    end: End,
}

impl Default for AnthropicStream {
    fn default() -> Self {
        AnthropicStream {
            blocks: BTreeMap::new(),
            stop_reason: None,
            end: End::Open,
        }
    }
}

impl AnthropicStream {
    /// Takes one event.
    pub(super) fn push(&mut self, at: &Chunk, root: &Json) -> Result<(), ProviderError> {
        let provider = at.provider;
        let prefix = at.root();
        let event = as_object(provider, root, &prefix)?;
        let kind = required_str(provider, event, &prefix, "type")?;
        if self.end != End::Open && kind != "ping" {
            return Err(at.mismatch(&key_path(&prefix, "type"), "event after message_stop"));
        }
        match kind {
            "message_start" => self.message_start(at, event, &prefix),
            "content_block_start" => {
                let index = index_field(provider, event, &prefix, "index")?;
                let block = required_object(provider, event, &prefix, "content_block")?.clone();
                if self.blocks.contains_key(&index) {
                    return Err(at.mismatch(&key_path(&prefix, "index"), "a block started twice"));
                }
                self.blocks.insert(
                    index,
                    Block {
                        block,
                        input_text: String::new(),
                        stopped: false,
                        input_error: None,
                    },
                );
                Ok(())
            }
            "content_block_delta" => self.delta(at, event, &prefix),
            "content_block_stop" => self.stop(at, event, &prefix),
            "message_delta" => {
                if let Some(delta) = optional_object(provider, event, &prefix, "delta")? {
                    let delta_path = key_path(&prefix, "delta");
                    if let Some(reason) = optional_str(provider, delta, &delta_path, "stop_reason")?
                    {
                        // A later reason must not hide the first: a
                        // `max_tokens` stop is what refuses a call cut off
                        // at the token limit.
                        if self
                            .stop_reason
                            .as_deref()
                            .is_some_and(|seen| seen != reason)
                        {
                            return Err(at.mismatch(
                                &key_path(&delta_path, "stop_reason"),
                                "a second stop_reason",
                            ));
                        }
                        self.stop_reason = Some(reason.to_owned());
                    }
                }
                Ok(())
            }
            "message_stop" => {
                self.end = End::Stopped;
                Ok(())
            }
            "error" => {
                self.end = End::Failed;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `message_start`: the message's `content` is normally empty; any
    /// blocks it does hold are taken as finished.
    fn message_start(
        &mut self,
        at: &Chunk,
        event: &Object,
        prefix: &str,
    ) -> Result<(), ProviderError> {
        let provider = at.provider;
        let message_path = key_path(prefix, "message");
        let message = required_object(provider, event, prefix, "message")?;
        // A stop reason already in the message (normally null) counts as
        // one from a `message_delta`: a `max_tokens` here still refuses a
        // cut-off call, as the whole message would.
        if let Some(reason) = optional_str(provider, message, &message_path, "stop_reason")? {
            if self.stop_reason.is_some() {
                return Err(at.mismatch(
                    &key_path(&message_path, "stop_reason"),
                    "a second stop_reason",
                ));
            }
            self.stop_reason = Some(reason.to_owned());
        }
        let Some(content) = optional_array(provider, message, &message_path, "content")? else {
            return Ok(());
        };
        if !self.blocks.is_empty() && !content.is_empty() {
            return Err(at.mismatch(&message_path, "a second message_start with content"));
        }
        let content_path = key_path(&message_path, "content");
        for (index, block) in content.iter().enumerate() {
            let block = as_object(provider, block, &index_path(&content_path, index))?;
            self.blocks.insert(
                index,
                Block {
                    block: block.clone(),
                    input_text: String::new(),
                    stopped: true,
                    input_error: None,
                },
            );
        }
        Ok(())
    }

    /// `content_block_delta`: appends `partial_json` to an open block.
    fn delta(&mut self, at: &Chunk, event: &Object, prefix: &str) -> Result<(), ProviderError> {
        let provider = at.provider;
        let index = index_field(provider, event, prefix, "index")?;
        let delta_path = key_path(prefix, "delta");
        let delta = required_object(provider, event, prefix, "delta")?;
        let delta_type = required_str(provider, delta, &delta_path, "type")?;
        let Some(block) = self.blocks.get_mut(&index).filter(|block| !block.stopped) else {
            return Err(at.mismatch(
                &key_path(prefix, "index"),
                "a delta for a block that is not open",
            ));
        };
        if delta_type == "input_json_delta" {
            let piece = required_str(provider, delta, &delta_path, "partial_json")?;
            block.input_text.push_str(piece);
        } else if block.is_call() && !TEXT_DELTAS.contains(&delta_type) {
            return Err(at.mismatch(
                &key_path(&delta_path, "type"),
                "an unknown delta for a tool_use block",
            ));
        }
        Ok(())
    }

    /// `content_block_stop`: a `tool_use` block's input becomes its parsed
    /// text.
    fn stop(&mut self, at: &Chunk, event: &Object, prefix: &str) -> Result<(), ProviderError> {
        let provider = at.provider;
        let index = index_field(provider, event, prefix, "index")?;
        let Some(block) = self.blocks.get_mut(&index).filter(|block| !block.stopped) else {
            return Err(at.mismatch(
                &key_path(prefix, "index"),
                "a stop for a block that is not open",
            ));
        };
        block.stopped = true;
        if block.is_call() && !block.input_text.is_empty() {
            match super::super::strict::parse(&block.input_text) {
                Ok(input) => block.block.set("input", input),
                // Judged at the end, once the stop reason is known.
                Err(err) => {
                    block.input_error = Some(ProviderError::ArgumentsNotJson {
                        provider,
                        field: key_path(&index_path("content", index), "input"),
                        reason: json_reason(&err),
                    });
                }
            }
        }
        Ok(())
    }

    /// True once `message_stop` arrived.
    pub(super) fn is_complete(&self) -> bool {
        self.end == End::Stopped
    }

    /// The message a non-streamed request would have returned.
    pub(super) fn into_document(self, provider: Provider) -> Result<Json, ProviderError> {
        match self.end {
            End::Open => return Err(incomplete(provider, "no message_stop event")),
            End::Failed => return Err(incomplete(provider, "the provider reported an error")),
            End::Stopped => {}
        }
        let mut content = Vec::with_capacity(self.blocks.len());
        let cut = matches!(
            self.stop_reason.as_deref(),
            Some("max_tokens" | "model_context_window_exceeded")
        );
        for (position, block) in self.blocks.into_values().enumerate() {
            if block.is_call() && !block.stopped {
                return Err(ProviderError::IncompleteCall {
                    provider,
                    field: index_path("content", position),
                });
            }
            if let Some(err) = block.input_error {
                // Cut at the token limit inside the call: an incomplete
                // call (raise the limit), not a model that wrote bad JSON.
                return Err(if cut {
                    ProviderError::IncompleteCall {
                        provider,
                        field: index_path("content", position),
                    }
                } else {
                    err
                });
            }
            content.push(Json::from(block.block));
        }
        let mut message = vec![("content", Json::Array(content))];
        if let Some(reason) = self.stop_reason {
            message.push(("stop_reason", Json::String(reason)));
        }
        Ok(Json::object(message))
    }
}

#[cfg(test)]
mod tests {
    use crate::model::Provider;
    use crate::provider::{ParseLimits, ProviderError, StreamAssembler};

    #[test]
    fn a_second_stop_reason_cannot_hide_a_cut_off_call() {
        // The tool_use block was the last one when the output hit the token
        // limit; a later message_delta saying `tool_use` made it runnable.
        let anthropic = Provider::Anthropic;
        let mut stream = StreamAssembler::new(anthropic, 0, ParseLimits::default()).unwrap();
        for chunk in [
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"pay","input":{}}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"}}"#,
        ] {
            stream.push(chunk).unwrap();
        }
        assert_eq!(
            stream.push(r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#),
            Err(ProviderError::StreamMismatch {
                provider: anthropic,
                chunk: 3,
                field: "chunk[3].delta.stop_reason".into(),
                reason: "a second stop_reason",
            })
        );
        // The same reason again, or a delta without one, is fine.
        let mut stream = StreamAssembler::new(anthropic, 0, ParseLimits::default()).unwrap();
        for chunk in [
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"pay","input":{}}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":9}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#,
            r#"{"type":"message_stop"}"#,
        ] {
            stream.push(chunk).unwrap();
        }
        assert_eq!(stream.finish().unwrap().len(), 1);
    }
}
