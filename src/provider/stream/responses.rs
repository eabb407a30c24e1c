//! OpenAI Responses streams: output-item and argument events.
//!
//! `response.output_item.added` opens the item at `output_index`;
//! `response.function_call_arguments.delta` appends to its arguments and
//! `response.function_call_arguments.done` states them whole;
//! `response.output_item.done` gives the finished item, whose arguments must
//! equal what the deltas and the `done` event said. `response.completed` (or
//! `response.incomplete`) ends the stream; `response.failed` and `error` end
//! it unusable. Other events (text, reasoning, hosted-tool progress) carry
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
    /// `response.output` of the terminal event, used only when no item
    /// events arrived.
    final_output: Option<Json>,
}

impl Default for ResponsesStream {
    fn default() -> Self {
        ResponsesStream {
            items: BTreeMap::new(),
            end: End::Open,
            final_output: None,
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
            "response.completed" => self.end(event, End::Completed),
            "response.incomplete" => self.end(event, End::Incomplete),
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
            done: false,
            deltas: String::new(),
            arguments_done: None,
        });
        if slot.done {
            return Err(at.mismatch(&key_path(prefix, "output_index"), "an item finished twice"));
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

    /// A terminal event; keeps `response.output` in case no item events came.
    fn end(&mut self, event: &Object, end: End) -> Result<(), ProviderError> {
        self.end = end;
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
