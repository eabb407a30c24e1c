//! OpenAI Responses API wire format.
//!
//! A response's `output[]` is a list of typed items. Each item type is put in
//! one of three classes ([`classify`]); the table is in `docs/providers.md`:
//!
//! * **a call for the client**: `function_call`, also when a program made it
//!   (`caller.type = "program"`, programmatic tool calling). Its correlation
//!   id is `call_id` (`id` is the item's own `fc_…` id), its arguments a
//!   JSON string that must parse as an object;
//! * **not for the client** (skipped): items that are no call (`message`,
//!   `reasoning`, `compaction`, `additional_tools`), calls OpenAI runs itself
//!   (hosted tools, `mcp_call`, server-side `tool_search_call`, the JavaScript
//!   `program` of programmatic tool calling), and answers (`*_output` items,
//!   `program_output`, `mcp_approval_response`);
//! * **refused** (`UnknownBlockType`): calls that expect a client answer this
//!   module cannot give (`computer_call`, `custom_tool_call`, `shell_call`,
//!   `local_shell_call`, `apply_patch_call`, `mcp_approval_request`, a
//!   client-executed `tool_search_call`) and every type not listed, so that a
//!   new kind of call is never silently dropped.
//!
//! A call whose `call_id` is answered by an output item of the same response
//! is not the client's to run and is skipped. A `function_call` whose
//! `status` is `in_progress` or `incomplete` is refused (`IncompleteCall`).
//!
//! **Namespaces.** A function declared inside a `namespace` tool comes back
//! with `namespace` set; two functions of one name in different namespaces
//! are different tools. The call's tool name is then `namespace.name` (OpenAI
//! names allow only letters, digits, `_` and `-`, so the dot is
//! unambiguous), which puts the namespace into the execution identity and the
//! args digest. A name or namespace containing `.` is refused. The result
//! item names the namespace again: `{"type":"function_call_output",
//! "call_id":…,"name":…,"namespace":…,"output":…}`; calls without a
//! namespace render as before, without `name`.

use std::collections::HashSet;

use super::error::ProviderError;
use super::fields::{
    arguments_from_text, as_object, clip, index_path, non_empty_str, optional, optional_str,
    required, required_array, required_str, Object, Output, RawCall,
};
use super::json::Json;
use crate::model::{Provider, ToolCall};

const RESPONSES: Provider = Provider::OpenAiResponses;

/// Separates namespace and function name in a tool name.
const NAMESPACE_SEPARATOR: char = '.';

/// What an output item is to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A call the client runs (`function_call`).
    Call,
    /// Not for the client: no call, or a call OpenAI runs itself.
    Skip,
    /// An answer to a call; its `call_id` marks that call answered.
    Answer,
    /// A call this module cannot answer (unless answered in the response).
    Refuse,
}

/// Every output item type this module knows, with its class. Types not
/// listed are refused.
const ITEM_TYPES: &[(&str, Class)] = &[
    ("function_call", Class::Call),
    ("message", Class::Skip),
    ("reasoning", Class::Skip),
    ("compaction", Class::Skip),
    ("additional_tools", Class::Skip),
    ("web_search_call", Class::Skip),
    ("file_search_call", Class::Skip),
    ("code_interpreter_call", Class::Skip),
    ("image_generation_call", Class::Skip),
    ("mcp_call", Class::Skip),
    ("mcp_list_tools", Class::Skip),
    ("program", Class::Skip),
    ("program_output", Class::Answer),
    ("function_call_output", Class::Answer),
    ("custom_tool_call_output", Class::Answer),
    ("computer_call_output", Class::Answer),
    ("shell_call_output", Class::Answer),
    ("local_shell_call_output", Class::Answer),
    ("apply_patch_call_output", Class::Answer),
    ("tool_search_output", Class::Answer),
    ("mcp_approval_response", Class::Answer),
    ("computer_call", Class::Refuse),
    ("custom_tool_call", Class::Refuse),
    ("shell_call", Class::Refuse),
    ("local_shell_call", Class::Refuse),
    ("apply_patch_call", Class::Refuse),
    ("mcp_approval_request", Class::Refuse),
];

/// The class of an item: its type from [`ITEM_TYPES`], except that a
/// `tool_search_call` is skipped when the server ran it
/// (`execution: "server"`) and refused otherwise.
fn classify(kind: &str, item: &Object, path: &str) -> Result<Class, ProviderError> {
    if kind == "tool_search_call" {
        let execution = optional_str(RESPONSES, item, path, "execution")?;
        return Ok(if execution == Some("server") {
            Class::Skip
        } else {
            Class::Refuse
        });
    }
    Ok(ITEM_TYPES
        .iter()
        .find_map(|&(name, class)| (name == kind).then_some(class))
        .unwrap_or(Class::Refuse))
}

/// Finds the `function_call` items of a Responses API response that are the
/// client's to run.
pub(super) fn locate(root: &Json) -> Result<Vec<RawCall<'_>>, ProviderError> {
    let obj = as_object(RESPONSES, root, "")?;
    let items = required_array(RESPONSES, obj, "", "output")?;
    let mut classified = Vec::with_capacity(items.len());
    let mut answered = HashSet::new();
    for (index, item) in items.iter().enumerate() {
        let path = index_path("output", index);
        let item = as_object(RESPONSES, item, &path)?;
        let kind = required_str(RESPONSES, item, &path, "type")?;
        let class = classify(kind, item, &path)?;
        if class == Class::Answer {
            if let Some(call_id) = optional_str(RESPONSES, item, &path, "call_id")? {
                answered.insert(call_id);
            }
        }
        classified.push((path, item, kind, class));
    }
    let mut found = Vec::new();
    for (path, item, kind, class) in classified {
        let answered_here = optional_str(RESPONSES, item, &path, "call_id")?
            .is_some_and(|id| answered.contains(id));
        match class {
            Class::Skip | Class::Answer => {}
            Class::Call | Class::Refuse if answered_here => {}
            Class::Call => {
                check_status(item, &path)?;
                if turn_dropped(obj)? {
                    // The response failed, was cancelled or was cut by the
                    // content filter: none of its calls is to be run (its
                    // stream ends in `response.failed` and is refused too).
                    return Err(ProviderError::IncompleteCall {
                        provider: RESPONSES,
                        field: path,
                    });
                }
                found.push(RawCall { path, item });
            }
            Class::Refuse => {
                return Err(ProviderError::UnknownBlockType {
                    provider: RESPONSES,
                    field: path,
                    block_type: clip(kind),
                })
            }
        }
    }
    Ok(found)
}

/// Is the response as a whole not one whose calls are to be run: `status`
/// `failed` or `cancelled`, not finished yet (`in_progress`, `queued`), or
/// `incomplete` because of the content filter?
fn turn_dropped(obj: &Object) -> Result<bool, ProviderError> {
    Ok(match optional_str(RESPONSES, obj, "", "status")? {
        // Not finished yet (a polled background response): it may still
        // end failed or cancelled.
        Some("failed" | "cancelled" | "in_progress" | "queued") => true,
        Some("incomplete") => match optional(obj, "incomplete_details") {
            Some(Json::Object(details)) => {
                optional_str(RESPONSES, details, "incomplete_details", "reason")?
                    == Some("content_filter")
            }
            _ => false,
        },
        _ => false,
    })
}

/// A `function_call` must be complete: `status` absent or `completed`.
fn check_status(item: &Object, path: &str) -> Result<(), ProviderError> {
    match optional_str(RESPONSES, item, path, "status")? {
        None | Some("completed") => Ok(()),
        Some(_) => Err(ProviderError::IncompleteCall {
            provider: RESPONSES,
            field: path.to_owned(),
        }),
    }
}

/// Converts one `function_call` item.
pub(super) fn convert(raw: &RawCall<'_>, position: u32) -> Result<ToolCall, ProviderError> {
    let call_id = non_empty_str(RESPONSES, raw.item, &raw.path, "call_id")?;
    let name = plain_name(raw.item, &raw.path, "name")?;
    let tool_name = match optional_str(RESPONSES, raw.item, &raw.path, "namespace")? {
        None => name.to_owned(),
        Some(_) => {
            let namespace = plain_name(raw.item, &raw.path, "namespace")?;
            format!("{namespace}{NAMESPACE_SEPARATOR}{name}")
        }
    };
    let arguments = arguments_from_text(
        RESPONSES,
        required(RESPONSES, raw.item, &raw.path, "arguments")?,
        &super::fields::key_path(&raw.path, "arguments"),
    )?;
    Ok(ToolCall {
        provider: RESPONSES,
        call_id: call_id.to_owned(),
        call_id_derived: false,
        tool_name,
        arguments,
        position,
    })
}

/// A non-empty name without the namespace separator.
fn plain_name<'a>(item: &'a Object, path: &str, key: &str) -> Result<&'a str, ProviderError> {
    let name = non_empty_str(RESPONSES, item, path, key)?;
    if name.contains(NAMESPACE_SEPARATOR) {
        return Err(ProviderError::WrongType {
            provider: RESPONSES,
            field: super::fields::key_path(path, key),
            expected: "name without `.`",
        });
    }
    Ok(name)
}

/// Renders `{"type":"function_call_output","call_id":…,"output":…}`, with
/// `name` and `namespace` before `output` for a namespaced call.
pub(super) fn render(call: &ToolCall, output: &Output) -> String {
    let mut members = vec![
        ("type", Json::str("function_call_output")),
        ("call_id", Json::str(&call.call_id)),
    ];
    if let Some((namespace, name)) = call.tool_name.split_once(NAMESPACE_SEPARATOR) {
        members.push(("name", Json::str(name)));
        members.push(("namespace", Json::str(namespace)));
    }
    members.push(("output", Json::str(&output.text)));
    Json::object(members).to_text()
}

#[cfg(test)]
mod tests;
