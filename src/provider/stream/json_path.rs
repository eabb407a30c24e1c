//! The JSON paths of Gemini's streamed arguments (`partialArgs[].jsonPath`).
//!
//! Gemini names each streamed argument by an RFC 9535 path such as
//! `$.location` or `$.stops[1]['name']`. Only singular paths make sense for
//! one value, so this reads exactly those: `$` followed by `.name`,
//! `['name']` / `["name"]` (with the usual escapes) and `[index]` segments.
//! Anything else (wildcards, slices, filters, negative indices) is refused.
//! [`insert`] builds the arguments ([`Tree`]) one value at a time, refusing a
//! second value for one path, a path through a value of another type and an
//! array index that would leave a gap.

use std::collections::BTreeMap;

use super::super::json::{Json, Object};
use super::super::strict::MAX_DEPTH;

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Segment {
    /// An object member.
    Key(String),
    /// An array element.
    Index(usize),
}

/// The segments of `path`, or `None` when it is not a singular path with at
/// least one segment.
pub(super) fn parse(path: &str) -> Option<Vec<Segment>> {
    let mut rest = path.strip_prefix('$')?;
    let mut segments = Vec::new();
    while !rest.is_empty() {
        if segments.len() >= MAX_DEPTH {
            return None;
        }
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            if !shorthand_name(name) {
                return None;
            }
            segments.push(Segment::Key(name.to_owned()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let (segment, after) = bracketed(after)?;
            segments.push(segment);
            rest = after;
        } else {
            return None;
        }
    }
    (!segments.is_empty()).then_some(segments)
}

/// A name after a `.`: not empty, not the wildcard `*`, and without the
/// characters that end or quote a segment. RFC 9535's shorthand is
/// stricter (no `-`, for one); a name like `user-id` is read as written,
/// since refusing it would drop a call that a looser writer spelled so.
fn shorthand_name(name: &str) -> bool {
    !name.is_empty() && name != "*" && !name.contains([']', '\'', '"', ' ', '*'])
}

/// `index]` or a quoted name and `]`, after the `[`.
fn bracketed(text: &str) -> Option<(Segment, &str)> {
    let quote = text.chars().next()?;
    if quote == '\'' || quote == '"' {
        let mut name = String::new();
        let mut chars = text[1..].char_indices();
        while let Some((at, ch)) = chars.next() {
            match ch {
                '\\' => name.push(match chars.next()?.1 {
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    escaped @ ('\\' | '/' | '\'' | '"') => escaped,
                    _ => return None,
                }),
                ch if ch == quote => {
                    let after = text[1 + at + 1..].strip_prefix(']')?;
                    return Some((Segment::Key(name), after));
                }
                ch => name.push(ch),
            }
        }
        return None;
    }
    let end = text.find(']')?;
    let digits = &text[..end];
    let valid = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    let index = if valid {
        digits.parse().ok()?
    } else {
        return None;
    };
    Some((Segment::Index(index), &text[end + 1..]))
}

/// Arguments being built from paths: objects keyed in a `BTreeMap`, so that
/// each insert costs a lookup, not a scan, and members come out sorted.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Node {
    /// A value set by a path (or given whole).
    Value(Json),
    /// An object.
    Object(Tree),
    /// An array.
    Array(Vec<Node>),
}

/// The members of an object node.
pub(super) type Tree = BTreeMap<String, Node>;

impl Node {
    /// The node for a whole JSON value.
    pub(super) fn from_json(value: Json) -> Node {
        match value {
            Json::Object(object) => Node::Object(tree_from(object)),
            Json::Array(items) => Node::Array(items.into_iter().map(Node::from_json).collect()),
            other => Node::Value(other),
        }
    }

    /// The JSON value, objects' members sorted by key.
    pub(super) fn into_json(self) -> Json {
        match self {
            Node::Value(value) => value,
            Node::Object(tree) => tree_into_json(tree),
            Node::Array(items) => Json::Array(items.into_iter().map(Node::into_json).collect()),
        }
    }
}

/// The tree of a JSON object.
pub(super) fn tree_from(object: Object) -> Tree {
    object
        .into_members()
        .into_iter()
        .map(|(key, value)| (key, Node::from_json(value)))
        .collect()
}

/// The JSON object of a tree, members sorted by key.
pub(super) fn tree_into_json(tree: Tree) -> Json {
    Json::Object(Object::from_members(
        tree.into_iter()
            .map(|(key, node)| (key, node.into_json()))
            .collect(),
    ))
}

/// Sets the value at `path` inside `root`, creating the objects and arrays
/// on the way.
///
/// # Errors
///
/// A fixed reason when `path` already has a value, passes through a value of
/// another type, or names an array index beyond the next free one.
pub(super) fn insert(root: &mut Tree, path: &[Segment], value: Json) -> Result<(), &'static str> {
    let Some((Segment::Key(key), rest)) = path.split_first() else {
        return Err("a path that does not start with a member name");
    };
    match (root.get_mut(key), rest.first()) {
        (Some(_), None) => Err("a second value for one path"),
        (None, None) => {
            root.insert(key.clone(), Node::Value(value));
            Ok(())
        }
        (Some(child), Some(_)) => insert_into(child, rest, value),
        (None, Some(next)) => {
            let child = root.entry(key.clone()).or_insert_with(|| empty_for(next));
            insert_into(child, rest, value)
        }
    }
}

/// [`insert`] below the root.
fn insert_into(node: &mut Node, path: &[Segment], value: Json) -> Result<(), &'static str> {
    let Some((first, rest)) = path.split_first() else {
        return Err("a second value for one path");
    };
    match (node, first) {
        (Node::Object(tree), Segment::Key(_)) => insert(tree, path, value),
        (Node::Array(items), Segment::Index(index)) => {
            let index = *index;
            if index > items.len() {
                return Err("an array index that leaves a gap");
            }
            match rest.first() {
                None if index < items.len() => Err("a second value for one path"),
                None => {
                    items.push(Node::Value(value));
                    Ok(())
                }
                Some(next) => {
                    if index == items.len() {
                        items.push(empty_for(next));
                    }
                    match items.get_mut(index) {
                        Some(child) => insert_into(child, rest, value),
                        None => Err("an array index that leaves a gap"),
                    }
                }
            }
        }
        _ => Err("a path through a value of another type"),
    }
}

/// The value set at `path`, mutably.
pub(super) fn get_mut<'a>(root: &'a mut Tree, path: &[Segment]) -> Option<&'a mut Json> {
    let (Segment::Key(key), rest) = path.split_first()? else {
        return None;
    };
    let mut current = root.get_mut(key)?;
    for segment in rest {
        current = match (current, segment) {
            (Node::Object(tree), Segment::Key(key)) => tree.get_mut(key)?,
            (Node::Array(items), Segment::Index(index)) => items.get_mut(*index)?,
            _ => return None,
        };
    }
    match current {
        Node::Value(value) => Some(value),
        _ => None,
    }
}

/// An empty container for the step `next` goes into.
fn empty_for(next: &Segment) -> Node {
    match next {
        Segment::Key(_) => Node::Object(Tree::new()),
        Segment::Index(_) => Node::Array(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Segment {
        Segment::Key(name.to_owned())
    }

    #[test]
    fn reads_singular_paths() {
        assert_eq!(parse("$.location"), Some(vec![key("location")]));
        assert_eq!(
            parse("$.foo.bar[0].data"),
            Some(vec![key("foo"), key("bar"), Segment::Index(0), key("data")])
        );
        assert_eq!(
            parse(r#"$['a.b']["c\"d"][12]"#),
            Some(vec![key("a.b"), key("c\"d"), Segment::Index(12)])
        );
        for bad in [
            "", "$", "location", "$.", "$..a", "$[*]", "$[-1]", "$[01]", "$['a'", "$.a[1:2]",
            "$[?@.a]",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn builds_objects_and_arrays() {
        let mut root = Tree::new();
        for (path, value) in [
            ("$.trip.stops[0].city", Json::str("Lyon")),
            ("$.trip.stops[1].city", Json::str("Turin")),
            ("$.trip.nights", Json::Number("3".into())),
            ("$.tags[0]", Json::str("rail")),
        ] {
            insert(&mut root, &parse(path).unwrap(), value).unwrap();
        }
        assert_eq!(
            tree_into_json(root.clone()).to_text(),
            r#"{"tags":["rail"],"trip":{"nights":3,"stops":[{"city":"Lyon"},{"city":"Turin"}]}}"#
        );
        let again = insert(&mut root, &parse("$.trip.nights").unwrap(), Json::Null);
        assert_eq!(again, Err("a second value for one path"));
        let gap = insert(&mut root, &parse("$.tags[5]").unwrap(), Json::Null);
        assert_eq!(gap, Err("an array index that leaves a gap"));
        let through = insert(&mut root, &parse("$.trip.nights.x").unwrap(), Json::Null);
        assert_eq!(through, Err("a path through a value of another type"));
        let Some(Json::String(city)) = get_mut(&mut root, &parse("$.trip.stops[1].city").unwrap())
        else {
            panic!("no city")
        };
        city.push_str(" Porta Nuova");
        assert!(tree_into_json(root).to_text().contains("Turin Porta Nuova"));
    }
}
