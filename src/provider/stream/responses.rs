//! OpenAI Responses streams: output-item and argument events.
//!
//! `response.output_item.added` opens the item at `output_index`;
//! `response.function_call_arguments.delta` appends to its arguments and
//! `response.function_call_arguments.done` states them whole;
//! `response.output_item.done` gives the finished item, which must be the
//! item announced at its index (same type; for a call the same `call_id`,
//! `name` and `namespace`) and whose arguments must equal what the deltas and
//! the `done` event said. `response.completed` (or `response.incomplete`)
//! ends the stream; its `response.output`, when items were streamed too,
//! must hold the same items (else a call only it holds would be dropped).
//! `response.failed` and `error` end it unusable. Other events (text, reasoning, hosted-tool progress) carry
//! nothing this module reads and are ignored: every item is classified, when
//! the stream is finished, by the same table as a whole response. An item
//! that was added but never done is still in progress, and a function call
//! in that state is refused.

use std::collections::BTreeMap;

use super::super::error::ProviderError;
use super::super::fields::{as_object, key_path, optional, optional_str, required_str, Object};
use super::super::json::Json;
use super::{incomplete, index_field, Chunk};
use crate::model::Provider;

/// One output item being assembled.
struct Slot {
    /// The item as last announced (`added`, then `done`).
    item: Object,
    /// True when `response.output_item.added` announced it.
    added: bool,
    /// True once `response.output_item.done` arrived.
    done: bool,
    /// The concatenated argument deltas.
    deltas: String,
    /// The arguments of `response.function_call_arguments.done`.
    arguments_done: Option<String>,
}

/// How the stream ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    Completed,
    Incomplete,
    Failed,
}

/// The state of one Responses stream.
pub(super) struct ResponsesStream {
    items: BTreeMap<usize, Slot>,
    end: End,
    /// `response.output` of the terminal event: the output when no item
    /// events arrived, otherwise checked against the streamed items.
    final_output: Option<Json>,
    /// The index of the terminal event's chunk (for its mismatch error).
    end_chunk: usize,
}

impl Default for ResponsesStream {
    fn default() -> Self {
        ResponsesStream {
            items: BTreeMap::new(),
            end: End::Open,
            final_output: None,
            end_chunk: 0,
        }
    }
}

impl ResponsesStream {
    /// Takes one event.
    pub(super) fn push(&mut self, at: &Chunk, root: &Json) -> Result<(), ProviderError> {
        let provider = at.provider;
        let prefix = at.root();
        let event = as_object(provider, root, &prefix)?;
        let kind = required_str(provider, event, &prefix, "type")?;
        if self.end != End::Open {
            return Err(at.mismatch(
                &key_path(&prefix, "type"),
                "event after the end of the response",
            ));
        }
        match kind {
            "response.output_item.added" => self.added(at, event, &prefix),
            "response.output_item.done" => self.item_done(at, event, &prefix),
            "response.function_call_arguments.delta" => {
                let slot = self.open_slot(at, event, &prefix)?;
                let delta = required_str(provider, event, &prefix, "delta")?;
                slot.deltas.push_str(delta);
                Ok(())
            }
            "response.function_call_arguments.done" => {
                let arguments = required_str(provider, event, &prefix, "arguments")?.to_owned();
                self.open_slot(at, event, &prefix)?.arguments_done = Some(arguments);
                Ok(())
            }
            "response.completed" => self.end(at, event, End::Completed),
            "response.incomplete" => self.end(at, event, End::Incomplete),
            "response.failed" | "error" => {
                self.end = End::Failed;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `response.output_item.added`: opens a slot.
    fn added(&mut self, at: &Chunk, event: &Object, prefix: &str) -> Result<(), ProviderError> {
        let provider = at.provider;
        let index = index_field(provider, event, prefix, "output_index")?;
        let item = item_field(provider, event, prefix)?;
        if self.items.contains_key(&index) {
            return Err(at.mismatch(&key_path(prefix, "output_index"), "an item added twice"));
        }
        self.items.insert(
            index,
            Slot {
                item,
                added: true,
                done: false,
                deltas: String::new(),
                arguments_done: None,
            },
        );
        Ok(())
    }

    /// `response.output_item.done`: the finished item, checked against the
    /// argument events.
    fn item_done(&mut self, at: &Chunk, event: &Object, prefix: &str) -> Result<(), ProviderError> {
        let provider = at.provider;
        let index = index_field(provider, event, prefix, "output_index")?;
        let mut item = item_field(provider, event, prefix)?;
        let item_path = key_path(prefix, "item");
        let slot = self.items.entry(index).or_insert_with(|| Slot {
            item: Object::default(),
            added: false,
            done: false,
            deltas: String::new(),
            arguments_done: None,
        });
        if slot.done {
            return Err(at.mismatch(&key_path(prefix, "output_index"), "an item finished twice"));
        }
        // The finished item is the one that was announced: the deltas at its
        // index are its arguments, so another call (or another kind of
        // item) in its place would take them over.
        if slot.added {
            if let Some(key) = differing_identity(&slot.item, &item) {
                return Err(at.mismatch(
                    &key_path(&item_path, key),
                    "a finished item that is not the one announced",
                ));
            }
        }
        let streamed = slot
            .arguments_done
            .clone()
            .or_else(|| (!slot.deltas.is_empty()).then(|| slot.deltas.clone()));
        if !slot.deltas.is_empty()
            && slot
                .arguments_done
                .as_ref()
                .is_some_and(|a| *a != slot.deltas)
        {
            return Err(at.mismatch(&item_path, "arguments differ from their deltas"));
        }
        match (
            optional_str(provider, &item, &item_path, "arguments")?,
            streamed,
        ) {
            (Some(text), Some(streamed)) if text != streamed => {
                return Err(at.mismatch(
                    &key_path(&item_path, "arguments"),
                    "arguments differ from their deltas",
                ))
            }
            (None, Some(streamed))
                if optional(&item, "type").and_then(Json::as_str) == Some("function_call") =>
            {
                item.set("arguments", Json::String(streamed));
            }
            _ => {}
        }
        slot.item = item;
        slot.done = true;
        Ok(())
    }

    /// The slot an argument event names, which must be open.
    fn open_slot(
        &mut self,
        at: &Chunk,
        event: &Object,
        prefix: &str,
    ) -> Result<&mut Slot, ProviderError> {
        let index = index_field(at.provider, event, prefix, "output_index")?;
        match self.items.get_mut(&index) {
            Some(slot) if !slot.done => Ok(slot),
            _ => Err(at.mismatch(
                &key_path(prefix, "output_index"),
                "arguments for an item that is not open",
            )),
        }
    }

    /// A terminal event; keeps `response.output` (the output when no item
    /// events came, otherwise checked against them).
    fn end(&mut self, at: &Chunk, event: &Object, end: End) -> Result<(), ProviderError> {
        self.end = end;
        self.end_chunk = at.index;
        self.final_output = optional(event, "response")
            .and_then(Json::as_object)
            .and_then(|response| optional(response, "output"))
            .cloned();
        Ok(())
    }

    /// True once `response.completed` or `response.incomplete` arrived.
    pub(super) fn is_complete(&self) -> bool {
        matches!(self.end, End::Completed | End::Incomplete)
    }

    /// The response a non-streamed request would have returned.
    pub(super) fn into_document(self, provider: Provider) -> Result<Json, ProviderError> {
        let status = match self.end {
            End::Open => return Err(incomplete(provider, "no response.completed event")),
            End::Failed => return Err(incomplete(provider, "the provider reported an error")),
            End::Completed => "completed",
            End::Incomplete => "incomplete",
        };
        if let (Some(output), false) = (&self.final_output, self.items.is_empty()) {
            let at = Chunk {
                provider,
                index: self.end_chunk,
            };
            check_final_output(&at, output, &self.items)?;
        }
        let output = match self.final_output {
            Some(output) if self.items.is_empty() => output,
            _ => Json::Array(
                self.items
                    .into_values()
                    .map(|mut slot| {
                        if !slot.done {
                            slot.item.set("status", Json::str("in_progress"));
                        }
                        Json::from(slot.item)
                    })
                    .collect(),
            ),
        };
        Ok(Json::object([
            ("status", Json::str(status)),
            ("output", output),
        ]))
    }
}

/// The event's `item` object.
fn item_field(provider: Provider, event: &Object, prefix: &str) -> Result<Object, ProviderError> {
    let item = super::super::fields::required_object(provider, event, prefix, "item")?;
    Ok(item.clone())
}

/// The first of the members that make an item which call it is (`type`, and
/// for a function call `call_id`, `name`, `namespace`) on which `a` and `b`
/// differ.
fn differing_identity(a: &Object, b: &Object) -> Option<&'static str> {
    let is_call = optional(a, "type").and_then(Json::as_str) == Some("function_call");
    let keys: &[&'static str] = if is_call {
        &["type", "call_id", "name", "namespace"]
    } else {
        &["type"]
    };
    keys.iter()
        .copied()
        .find(|key| optional(a, key) != optional(b, key))
}

/// The terminal event's `response.output`, when items were streamed too,
/// must hold the same items: a call only the final output holds would be
/// dropped, and one whose arguments differ there would run with one of two
/// texts the provider sent.
fn check_final_output(
    at: &Chunk,
    output: &Json,
    items: &BTreeMap<usize, Slot>,
) -> Result<(), ProviderError> {
    let field = format!("{}.response.output", at.root());
    let reason = "the final output differs from the streamed items";
    let Some(finals) = output.as_array() else {
        return Err(at.mismatch(&field, reason));
    };
    if finals.len() != items.len() {
        return Err(at.mismatch(&field, reason));
    }
    for (index, (slot, last)) in items.values().zip(finals).enumerate() {
        let Some(last) = last.as_object() else {
            return Err(at.mismatch(&field, reason));
        };
        let differs = differing_identity(&slot.item, last).is_some()
            || (slot.done
                && optional(&slot.item, "type").and_then(Json::as_str) == Some("function_call")
                && optional(&slot.item, "arguments") != optional(last, "arguments"));
        if differs {
            return Err(at.mismatch(&format!("{field}[{index}]"), reason));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::model::Provider;
    use crate::provider::{ParseLimits, ProviderError, StreamAssembler};

    const RESPONSES: Provider = Provider::OpenAiResponses;

    fn assemble(chunks: &[&str]) -> Result<Vec<crate::model::ToolCall>, ProviderError> {
        let mut stream = StreamAssembler::new(RESPONSES, 0, ParseLimits::default())?;
        for chunk in chunks {
            stream.push(chunk)?;
        }
        stream.finish()
    }

    const ADDED_PAY: &str = r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","call_id":"call_1","name":"pay","arguments":""}}"#;
    const DELTA_ONE: &str = r#"{"type":"response.function_call_arguments.delta","output_index":0,"delta":"{\"amount\":1}"}"#;
    const DONE_PAY: &str = r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","call_id":"call_1","name":"pay","arguments":"{\"amount\":1}"}}"#;

    #[test]
    fn a_finished_item_must_be_the_one_announced() {
        // The deltas of `pay` (call_1) were handed to another call (call_2,
        // `refund`) that the done event put at the same index.
        let outcome = assemble(&[
            ADDED_PAY,
            DELTA_ONE,
            r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","call_id":"call_2","name":"refund"}}"#,
            r#"{"type":"response.completed","response":{}}"#,
        ]);
        assert_eq!(
            outcome,
            Err(ProviderError::StreamMismatch {
                provider: RESPONSES,
                chunk: 2,
                field: "chunk[2].item.call_id".into(),
                reason: "a finished item that is not the one announced",
            })
        );
        // A call announced and finished as a message: its deltas vanished.
        let outcome = assemble(&[
            ADDED_PAY,
            DELTA_ONE,
            r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"message","content":[]}}"#,
            r#"{"type":"response.completed","response":{}}"#,
        ]);
        assert!(matches!(
            outcome,
            Err(ProviderError::StreamMismatch {
                reason: "a finished item that is not the one announced",
                ..
            })
        ));
        // The usual stream still assembles.
        let calls = assemble(&[
            ADDED_PAY,
            DELTA_ONE,
            DONE_PAY,
            r#"{"type":"response.completed","response":{}}"#,
        ])
        .unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments, r#"{"amount":1}"#);
    }

    #[test]
    fn a_final_output_that_differs_from_the_streamed_items_is_refused() {
        let mismatch = |outcome: Result<_, ProviderError>| {
            assert_eq!(
                outcome,
                Err(ProviderError::StreamMismatch {
                    provider: RESPONSES,
                    chunk: 3,
                    field: "chunk[3].response.output".into(),
                    reason: "the final output differs from the streamed items",
                })
            )
        };
        // Other arguments in the final output than in the stream.
        let other_arguments = assemble(&[
            ADDED_PAY,
            DELTA_ONE,
            DONE_PAY,
            r#"{"type":"response.completed","response":{"output":[{"type":"function_call","call_id":"call_1","name":"pay","arguments":"{\"amount\":1000}"}]}}"#,
        ]);
        assert!(
            matches!(
                &other_arguments,
                Err(ProviderError::StreamMismatch { field, .. }) if field == "chunk[3].response.output[0]"
            ),
            "{other_arguments:?}"
        );
        // A call only the final output holds was dropped: no call at all.
        let message_added = r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"message","content":[]}}"#;
        let message_done = r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"message","content":[]}}"#;
        mismatch(assemble(&[
            message_added,
            message_done,
            r#"{"type":"response.output_text.done","output_index":0,"text":""}"#,
            r#"{"type":"response.completed","response":{"output":[{"type":"message","content":[]},{"type":"function_call","call_id":"call_1","name":"pay","arguments":"{\"amount\":1000}"}]}}"#,
        ]));
        // The same items (as OpenAI sends them) are fine, and so is a
        // terminal event without the output.
        for end in [
            r#"{"type":"response.completed","response":{"output":[{"type":"function_call","call_id":"call_1","name":"pay","arguments":"{\"amount\":1}","status":"completed"}]}}"#,
            r#"{"type":"response.completed","response":{"status":"completed"}}"#,
        ] {
            let calls = assemble(&[ADDED_PAY, DELTA_ONE, DONE_PAY, end]).unwrap();
            assert_eq!(calls[0].arguments, r#"{"amount":1}"#);
        }
    }
}
