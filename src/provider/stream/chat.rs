//! OpenAI Chat Completions streams: `delta.tool_calls` fragments.
//!
//! Each chunk is a `chat.completion.chunk`; `choices[0].delta.tool_calls[]`
//! holds fragments keyed by `index`: the first carries `id`, `type` and
//! `function.name`, the following ones pieces of `function.arguments`, which
//! are concatenated. An `id`, `type` or `name` sent again must be the same.
//! The stream is complete with the chunk whose choice has a `finish_reason`;
//! after it only chunks without call fragments are accepted (the usage chunk,
//! `[DONE]`). Only the first choice is read, as for whole responses.

use std::collections::BTreeMap;

use super::super::error::ProviderError;
use super::super::fields::{
    as_object, index_path, key_path, optional_array, optional_object, optional_str, Object,
};
use super::super::json::Json;
use super::{incomplete, index_field, Chunk};
use crate::model::Provider;

/// One call being assembled.
#[derive(Default)]
struct Fragments {
    id: Option<String>,
    kind: Option<String>,
    name: Option<String>,
    arguments: String,
}

/// The state of one Chat Completions stream.
#[derive(Default)]
pub(super) struct ChatStream {
    calls: BTreeMap<usize, Fragments>,
    finish_reason: Option<String>,
}

impl ChatStream {
    /// Takes one `chat.completion.chunk`.
    pub(super) fn push(&mut self, at: &Chunk, root: &Json) -> Result<(), ProviderError> {
        let provider = at.provider;
        let prefix = at.root();
        let chunk = as_object(provider, root, &prefix)?;
        let Some(choices) = optional_array(provider, chunk, &prefix, "choices")? else {
            return Ok(());
        };
        let choices_path = key_path(&prefix, "choices");
        for (position, choice) in choices.iter().enumerate() {
            let path = index_path(&choices_path, position);
            let choice = as_object(provider, choice, &path)?;
            if index_field(provider, choice, &path, "index")? == 0 {
                self.choice(at, choice, &path)?;
            }
        }
        Ok(())
    }

    /// Takes the first choice of a chunk.
    fn choice(&mut self, at: &Chunk, choice: &Object, path: &str) -> Result<(), ProviderError> {
        let provider = at.provider;
        if let Some(delta) = optional_object(provider, choice, path, "delta")? {
            let delta_path = key_path(path, "delta");
            if let Some(fragments) = optional_array(provider, delta, &delta_path, "tool_calls")? {
                let list = key_path(&delta_path, "tool_calls");
                if self.finish_reason.is_some() && !fragments.is_empty() {
                    return Err(at.mismatch(&list, "call fragment after the finish_reason"));
                }
                for (position, fragment) in fragments.iter().enumerate() {
                    let fragment_path = index_path(&list, position);
                    let fragment = as_object(provider, fragment, &fragment_path)?;
                    self.fragment(at, fragment, &fragment_path)?;
                }
            }
        }
        if let Some(reason) = optional_str(provider, choice, path, "finish_reason")? {
            match &self.finish_reason {
                Some(seen) if seen != reason => {
                    return Err(
                        at.mismatch(&key_path(path, "finish_reason"), "a second finish_reason")
                    )
                }
                _ => self.finish_reason = Some(reason.to_owned()),
            }
        }
        Ok(())
    }

    /// Adds one `tool_calls[]` fragment to the call with its `index`.
    fn fragment(&mut self, at: &Chunk, fragment: &Object, path: &str) -> Result<(), ProviderError> {
        let provider = at.provider;
        let index = index_field(provider, fragment, path, "index")?;
        let call = self.calls.entry(index).or_default();
        set_once(
            at,
            &mut call.id,
            optional_str(provider, fragment, path, "id")?,
            &key_path(path, "id"),
        )?;
        set_once(
            at,
            &mut call.kind,
            optional_str(provider, fragment, path, "type")?,
            &key_path(path, "type"),
        )?;
        if let Some(function) = optional_object(provider, fragment, path, "function")? {
            let function_path = key_path(path, "function");
            set_once(
                at,
                &mut call.name,
                optional_str(provider, function, &function_path, "name")?,
                &key_path(&function_path, "name"),
            )?;
            if let Some(piece) = optional_str(provider, function, &function_path, "arguments")? {
                call.arguments.push_str(piece);
            }
        }
        Ok(())
    }

    /// Takes the `[DONE]` sentinel: nothing may follow it.
    pub(super) fn done(&mut self, at: &Chunk) -> Result<(), ProviderError> {
        if self.finish_reason.is_none() {
            return Err(at.mismatch(&at.root(), "[DONE] before any finish_reason"));
        }
        Ok(())
    }

    /// True once a chunk carried a `finish_reason`.
    pub(super) fn is_complete(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// The completion a non-streamed request would have returned.
    pub(super) fn into_document(self, provider: Provider) -> Result<Json, ProviderError> {
        let Some(finish_reason) = self.finish_reason else {
            return Err(incomplete(provider, "no chunk carried a finish_reason"));
        };
        let tool_calls = self
            .calls
            .into_values()
            .map(|call| {
                let mut members = Vec::with_capacity(3);
                if let Some(id) = call.id {
                    members.push(("id", Json::String(id)));
                }
                if let Some(kind) = call.kind {
                    members.push(("type", Json::String(kind)));
                }
                let mut function = Vec::with_capacity(2);
                if let Some(name) = call.name {
                    function.push(("name", Json::String(name)));
                }
                function.push(("arguments", Json::String(call.arguments)));
                members.push(("function", Json::object(function)));
                Json::object(members)
            })
            .collect();
        let message = Json::object([
            ("role", Json::str("assistant")),
            ("tool_calls", Json::Array(tool_calls)),
        ]);
        Ok(Json::object([(
            "choices",
            Json::Array(vec![Json::object([
                ("index", Json::Number("0".to_owned())),
                ("message", message),
                ("finish_reason", Json::String(finish_reason)),
            ])]),
        )]))
    }
}

/// Sets `slot` from a fragment; a value sent again must be the same.
fn set_once(
    at: &Chunk,
    slot: &mut Option<String>,
    value: Option<&str>,
    path: &str,
) -> Result<(), ProviderError> {
    match (slot.as_deref(), value) {
        (_, None) => Ok(()),
        (None, Some(value)) => {
            *slot = Some(value.to_owned());
            Ok(())
        }
        (Some(seen), Some(value)) if seen == value => Ok(()),
        (Some(_), Some(_)) => {
            Err(at.mismatch(path, "a value that differs from the one sent before"))
        }
    }
}
