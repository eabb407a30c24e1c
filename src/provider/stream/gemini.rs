//! Gemini streams: `streamGenerateContent` chunks and streamed arguments.
//!
//! Each chunk is a `GenerateContentResponse` whose first candidate carries
//! the parts produced since the last chunk; they are appended in order. A
//! whole `functionCall` part is kept as it is. With
//! `streamFunctionCallArguments`, a call comes as a `functionCall` with
//! `name` (and `id`) and `willContinue: true`, then `functionCall`s holding
//! `partialArgs` (each a `jsonPath` and one of `stringValue`, `numberValue`,
//! `boolValue`, `nullValue`; a string continues over several pieces while
//! `willContinue` is true), then one without `willContinue`. The pieces are
//! joined into one `functionCall` with `args`, at the place the call
//! started; a number keeps the text it was sent in. The stream is complete
//! with the chunk that carries a `finishReason`.

use std::collections::HashSet;

use super::super::error::ProviderError;
use super::super::fields::{
    as_object, first, flag, index_path, key_path, non_empty_str, optional, optional_array,
    optional_object, optional_str, required_str, Object,
};
use super::super::json::Json;
use super::json_path::{self, Segment, Tree};
use super::{incomplete, Chunk};
use crate::model::Provider;

/// A call whose arguments are being streamed.
struct Pending {
    /// Where the call goes in `parts`.
    slot: usize,
    /// The part that started the call (kept for fields such as
    /// `thoughtSignature`).
    part: Object,
    id: Option<String>,
    name: String,
    args: Tree,
    /// Paths whose string value is still being continued.
    open_paths: HashSet<String>,
}

/// The state of one Gemini stream.
#[derive(Default)]
pub(super) struct GeminiStream {
    parts: Vec<Json>,
    pending: Option<Pending>,
    finish_reason: Option<String>,
}

impl GeminiStream {
    /// Takes one chunk (or the array of a non-SSE stream).
    pub(super) fn push(&mut self, at: &Chunk, root: &Json) -> Result<(), ProviderError> {
        let prefix = at.root();
        match root {
            Json::Array(chunks) => chunks
                .iter()
                .enumerate()
                .try_for_each(|(index, chunk)| self.chunk(at, chunk, &index_path(&prefix, index))),
            chunk => self.chunk(at, chunk, &prefix),
        }
    }

    /// Takes one `GenerateContentResponse`.
    fn chunk(&mut self, at: &Chunk, root: &Json, prefix: &str) -> Result<(), ProviderError> {
        let provider = at.provider;
        let chunk = as_object(provider, root, prefix)?;
        let Some(candidates) = optional_array(provider, chunk, prefix, "candidates")? else {
            return Ok(());
        };
        let candidates_path = key_path(prefix, "candidates");
        let candidate_path = index_path(&candidates_path, 0);
        let candidate = as_object(
            provider,
            first(provider, candidates, &candidates_path)?,
            &candidate_path,
        )?;
        if let Some(content) = optional_object(provider, candidate, &candidate_path, "content")? {
            let content_path = key_path(&candidate_path, "content");
            if let Some(parts) = optional_array(provider, content, &content_path, "parts")? {
                let parts_path = key_path(&content_path, "parts");
                if self.finish_reason.is_some() && !parts.is_empty() {
                    return Err(at.mismatch(&parts_path, "content after the finishReason"));
                }
                for (index, part) in parts.iter().enumerate() {
                    let part_path = index_path(&parts_path, index);
                    let part = as_object(provider, part, &part_path)?;
                    self.part(at, part, &part_path)?;
                }
            }
        }
        // An empty reason means the model has not stopped (as for a whole
        // response): the stream goes on.
        if let Some(reason) = optional_str(provider, candidate, &candidate_path, "finishReason")?
            .filter(|reason| crate::provider::gemini::ends_turn(reason))
        {
            self.finish_reason = Some(reason.to_owned());
        }
        Ok(())
    }

    /// Appends one part, joining streamed call pieces.
    fn part(&mut self, at: &Chunk, part: &Object, path: &str) -> Result<(), ProviderError> {
        let provider = at.provider;
        let call_path = key_path(path, "functionCall");
        let Some(call) = optional_object(provider, part, path, "functionCall")? else {
            self.parts.push(Json::from(part.clone()));
            return Ok(());
        };
        let continues = flag(provider, call, &call_path, "willContinue")?;
        let streamed =
            self.pending.is_some() || continues || optional(call, "partialArgs").is_some();
        if !streamed {
            self.parts.push(Json::from(part.clone()));
            return Ok(());
        }
        let pending = match self.pending.take() {
            Some(pending) => continue_call(at, pending, call, &call_path)?,
            None => self.start_call(at, part, call, &call_path)?,
        };
        let mut pending = apply_partial_args(at, pending, call, &call_path)?;
        if continues {
            self.pending = Some(pending);
            return Ok(());
        }
        if !pending.open_paths.is_empty() {
            return Err(ProviderError::IncompleteCall {
                provider,
                field: call_path,
            });
        }
        let mut function_call = Vec::with_capacity(3);
        if let Some(id) = pending.id {
            function_call.push(("id", Json::String(id)));
        }
        function_call.push(("name", Json::String(pending.name)));
        function_call.push(("args", json_path::tree_into_json(pending.args)));
        pending
            .part
            .set("functionCall", Json::object(function_call));
        self.parts[pending.slot] = Json::from(pending.part);
        Ok(())
    }

    /// The first piece of a streamed call: its name and id.
    fn start_call(
        &mut self,
        at: &Chunk,
        part: &Object,
        call: &Object,
        path: &str,
    ) -> Result<Pending, ProviderError> {
        let provider = at.provider;
        let name = non_empty_str(provider, call, path, "name")?.to_owned();
        let id = optional_str(provider, call, path, "id")?
            .filter(|id| !id.is_empty())
            .map(str::to_owned);
        let args = match optional_object(provider, call, path, "args")? {
            Some(args) => json_path::tree_from(args.clone()),
            None => Tree::new(),
        };
        let slot = self.parts.len();
        self.parts.push(Json::Null);
        Ok(Pending {
            slot,
            part: part.clone(),
            id,
            name,
            args,
            open_paths: HashSet::new(),
        })
    }

    /// True once a chunk carried a `finishReason`.
    pub(super) fn is_complete(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// The response a non-streamed request would have returned.
    pub(super) fn into_document(self, provider: Provider) -> Result<Json, ProviderError> {
        let Some(finish_reason) = self.finish_reason else {
            return Err(incomplete(provider, "no chunk carried a finishReason"));
        };
        if let Some(pending) = self.pending {
            return Err(ProviderError::IncompleteCall {
                provider,
                field: format!("candidates[0].content.parts[{}].functionCall", pending.slot),
            });
        }
        let content = Json::object([
            ("role", Json::str("model")),
            ("parts", Json::Array(self.parts)),
        ]);
        Ok(Json::object([(
            "candidates",
            Json::Array(vec![Json::object([
                ("content", content),
                ("finishReason", Json::String(finish_reason)),
            ])]),
        )]))
    }
}

/// A later piece of the pending call: same name and id if it repeats them,
/// no whole `args`.
fn continue_call(
    at: &Chunk,
    pending: Pending,
    call: &Object,
    path: &str,
) -> Result<Pending, ProviderError> {
    let provider = at.provider;
    if optional_str(provider, call, path, "name")?.is_some_and(|name| name != pending.name) {
        return Err(at.mismatch(
            &key_path(path, "name"),
            "a new call before the last one ended",
        ));
    }
    let id = optional_str(provider, call, path, "id")?.filter(|id| !id.is_empty());
    if id.is_some() && id != pending.id.as_deref() {
        return Err(at.mismatch(
            &key_path(path, "id"),
            "a new call before the last one ended",
        ));
    }
    if optional(call, "args").is_some() {
        return Err(at.mismatch(&key_path(path, "args"), "whole args inside a streamed call"));
    }
    Ok(pending)
}

/// Adds the `partialArgs` of one piece to the pending call.
fn apply_partial_args(
    at: &Chunk,
    mut pending: Pending,
    call: &Object,
    path: &str,
) -> Result<Pending, ProviderError> {
    let provider = at.provider;
    let Some(pieces) = optional_array(provider, call, path, "partialArgs")? else {
        return Ok(pending);
    };
    let list = key_path(path, "partialArgs");
    for (index, piece) in pieces.iter().enumerate() {
        let piece_path = index_path(&list, index);
        let piece = as_object(provider, piece, &piece_path)?;
        let json_path = required_str(provider, piece, &piece_path, "jsonPath")?;
        let segments = json_path::parse(json_path).ok_or_else(|| {
            at.mismatch(
                &key_path(&piece_path, "jsonPath"),
                "an unsupported JSON path",
            )
        })?;
        let value = piece_value(at, piece, &piece_path)?;
        if pending.open_paths.contains(json_path) {
            append(&mut pending.args, &segments, value)
                .map_err(|reason| at.mismatch(&piece_path, reason))?;
        } else {
            json_path::insert(&mut pending.args, &segments, value)
                .map_err(|reason| at.mismatch(&piece_path, reason))?;
        }
        if flag(provider, piece, &piece_path, "willContinue")? {
            pending.open_paths.insert(json_path.to_owned());
        } else {
            pending.open_paths.remove(json_path);
        }
    }
    Ok(pending)
}

/// The one value of a `PartialArg`.
fn piece_value(at: &Chunk, piece: &Object, path: &str) -> Result<Json, ProviderError> {
    let provider = at.provider;
    let mut values = Vec::with_capacity(1);
    if let Some(text) = optional_str(provider, piece, path, "stringValue")? {
        values.push(Json::str(text));
    }
    match optional(piece, "numberValue") {
        None => {}
        Some(number @ Json::Number(_)) => values.push(number.clone()),
        Some(_) => {
            return Err(ProviderError::WrongType {
                provider,
                field: key_path(path, "numberValue"),
                expected: "number",
            })
        }
    }
    if let Some(value) = optional(piece, "boolValue") {
        let value = value.as_bool().ok_or_else(|| ProviderError::WrongType {
            provider,
            field: key_path(path, "boolValue"),
            expected: "boolean",
        })?;
        values.push(Json::Bool(value));
    }
    // `nullValue` is the protobuf enum `NULL_VALUE`, written as `null` or as
    // its name.
    match piece.get("nullValue") {
        None => {}
        Some(Json::Null) => values.push(Json::Null),
        Some(Json::String(name)) if name == "NULL_VALUE" => values.push(Json::Null),
        Some(_) => {
            return Err(ProviderError::WrongType {
                provider,
                field: key_path(path, "nullValue"),
                expected: "null",
            })
        }
    }
    match values.len() {
        1 => Ok(values.remove(0)),
        _ => Err(at.mismatch(path, "a partial argument without exactly one value")),
    }
}

/// Continues the string at `segments` with `value`.
fn append(args: &mut Tree, segments: &[Segment], value: Json) -> Result<(), &'static str> {
    match (json_path::get_mut(args, segments), value) {
        (Some(Json::String(text)), Json::String(piece)) => {
            text.push_str(&piece);
            Ok(())
        }
        _ => Err("a continued value that is not a string"),
    }
}

#[cfg(test)]
mod tests {
    use crate::model::Provider;
    use crate::provider::{ParseLimits, StreamAssembler};

    #[test]
    fn an_empty_finish_reason_does_not_end_the_stream() {
        // A whole response reads `finishReason: ""` as "not stopped"; the
        // stream read it as the end: complete after the first chunk (an app
        // that stops reading there got no calls), and the call that came
        // next refused as content after the end.
        let mut stream = StreamAssembler::new(Provider::Gemini, 0, ParseLimits::default()).unwrap();
        stream
            .push(
                r#"{"candidates":[{"content":{"parts":[{"text":"Paying."}]},"finishReason":""}]}"#,
            )
            .unwrap();
        assert!(!stream.is_complete());
        stream
            .push(r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"pay","args":{"amount":5}}}]},"finishReason":"STOP"}]}"#)
            .unwrap();
        assert!(stream.is_complete());
        let calls = stream.finish().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments, r#"{"amount":5}"#);
    }
}
