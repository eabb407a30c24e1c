//! Responses API parsing and rendering: item classes, namespaces, statuses.

use super::super::tests::{result, tool_call};
use super::super::{parse_tool_calls, render_tool_result, ParseLimits};
use super::*;

fn parse(json: &str) -> Result<Vec<ToolCall>, ProviderError> {
    parse_tool_calls(RESPONSES, json, 0, &ParseLimits::default())
}

fn call(id: &str, name: &str, args: &str, position: u32) -> ToolCall {
    tool_call(RESPONSES, id, false, name, args, position)
}

/// A response whose `output` is `items` (JSON text of the array's items).
fn response(items: &str) -> String {
    format!(r#"{{"object":"response","status":"completed","output":[{items}]}}"#)
}

const FUNCTION_CALL: &str =
    r#"{"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{}"}"#;

#[test]
fn skips_reasoning_and_keeps_call_id() {
    let json = include_str!("../../../tests/fixtures/providers/openai_responses_parallel.json");
    assert_eq!(
        parse(json).unwrap(),
        vec![
            call(
                "call_9fKd2LmQ7wZx4TbN",
                "get_weather",
                r#"{"city":"Lisbon","units":"metric"}"#,
                0
            ),
            call(
                "call_3hRt8YpV1sGc6JuE",
                "create_event",
                r#"{"location":"Café Nicola, Lisboa","start":"2025-06-02T19:30:00+01:00","title":"Dinner with Ana"}"#,
                1
            ),
        ]
    );
}

#[test]
fn unicode_and_malformed() {
    let json = include_str!("../../../tests/fixtures/providers/openai_responses_unicode.json");
    assert_eq!(
        parse(json).unwrap(),
        vec![call(
            "call_Uu1cOdE7xYz",
            "send_message",
            r##"{"channel":"#général","text":"Grüße 👋 from Zürich, 你好，世界 and a \"quoted\" word\n"}"##,
            0
        )]
    );
    let bad = include_str!("../../../tests/fixtures/providers/openai_responses_bad_arguments.json");
    assert!(matches!(
        parse(bad),
        Err(ProviderError::ArgumentsNotJson { provider: RESPONSES, ref field, .. })
            if field == "output[1].arguments"
    ));
    let no_call_id =
        response(r#"{"type":"function_call","id":"fc_1","name":"f","arguments":"{}"}"#);
    assert_eq!(
        parse(&no_call_id),
        Err(ProviderError::MissingField {
            provider: RESPONSES,
            field: "output[0].call_id".into()
        })
    );
}

#[test]
fn program_items_do_not_hide_the_function_calls() {
    let json = include_str!("../../../tests/fixtures/providers/openai_responses_program.json");
    assert_eq!(
        parse(json).unwrap(),
        vec![
            // Made by the program: still the client's to run.
            call(
                "call_Lk2pQ7vN4xR9tY1w",
                "lookup_order",
                r#"{"order_id":"A-1009"}"#,
                0
            ),
            // The total keeps its trailing zero.
            call(
                "call_Rf8sD3mK6zH0jB5c",
                "send_receipt",
                r#"{"currency":"EUR","order_id":"A-1009","total":1249.90}"#,
                1
            ),
        ]
    );
}

#[test]
fn each_item_type_has_a_class() {
    let skipped = [
        r#"{"type":"message","id":"msg_1","role":"assistant","content":[]}"#,
        r#"{"type":"compaction","id":"cmp_1","encrypted_content":"x"}"#,
        r#"{"type":"additional_tools","id":"at_1","role":"developer","tools":[]}"#,
        r#"{"type":"mcp_call","id":"mcp_1","name":"f","arguments":"{}","server_label":"s"}"#,
        r#"{"type":"tool_search_call","id":"ts_1","arguments":{},"execution":"server","status":"completed"}"#,
        r#"{"type":"tool_search_output","id":"tso_1","execution":"server","status":"completed","tools":[]}"#,
        r#"{"type":"program","id":"prg_1","call_id":"call_p","code":"1","fingerprint":"f"}"#,
        r#"{"type":"program_output","id":"pro_1","call_id":"call_p","result":"1","status":"completed"}"#,
    ];
    for item in skipped {
        let json = response(&format!("{item},{FUNCTION_CALL}"));
        assert_eq!(
            parse(&json).unwrap(),
            vec![call("call_1", "f", "{}", 0)],
            "{item}"
        );
    }
    let refused = [
        (
            "computer_call",
            r#"{"type":"computer_call","id":"cu_1","call_id":"call_c","action":{"type":"click"}}"#,
        ),
        (
            "custom_tool_call",
            r#"{"type":"custom_tool_call","call_id":"call_c","name":"g","input":"x"}"#,
        ),
        (
            "shell_call",
            r#"{"type":"shell_call","id":"sh_1","call_id":"call_c","action":{"commands":["ls"]},"status":"completed"}"#,
        ),
        (
            "apply_patch_call",
            r#"{"type":"apply_patch_call","id":"ap_1","call_id":"call_c","operation":{"type":"delete_file","path":"a"},"status":"completed"}"#,
        ),
        (
            "mcp_approval_request",
            r#"{"type":"mcp_approval_request","id":"mcpr_1","name":"g","arguments":"{}","server_label":"s"}"#,
        ),
        (
            "tool_search_call",
            r#"{"type":"tool_search_call","id":"ts_1","call_id":"call_c","arguments":{},"execution":"client","status":"completed"}"#,
        ),
        ("hologram_call", r#"{"type":"hologram_call","id":"h_1"}"#),
    ];
    for (kind, item) in refused {
        let json = response(&format!("{FUNCTION_CALL},{item}"));
        assert_eq!(
            parse(&json),
            Err(ProviderError::UnknownBlockType {
                provider: RESPONSES,
                field: "output[1]".into(),
                block_type: kind.into()
            }),
            "{item}"
        );
    }
}

#[test]
fn a_call_answered_in_the_same_response_is_skipped() {
    let answered = response(&format!(
        r#"{FUNCTION_CALL},{{"type":"function_call_output","id":"fco_1","call_id":"call_1","output":"done","status":"completed"}},
        {{"type":"function_call","id":"fc_2","call_id":"call_2","name":"g","arguments":"{{}}"}},
        {{"type":"shell_call","id":"sh_1","call_id":"call_3","action":{{"commands":["ls"]}},"status":"completed"}},
        {{"type":"shell_call_output","id":"sho_1","call_id":"call_3","output":[]}}"#
    ));
    assert_eq!(
        parse(&answered).unwrap(),
        vec![call("call_2", "g", "{}", 0)]
    );
}

#[test]
fn unfinished_function_calls_are_refused() {
    for status in ["in_progress", "incomplete"] {
        let json = response(&format!(
            r#"{FUNCTION_CALL},{{"type":"function_call","id":"fc_2","call_id":"call_2","name":"g","arguments":"{{\"to\":","status":"{status}"}}"#
        ));
        assert_eq!(
            parse(&json),
            Err(ProviderError::IncompleteCall {
                provider: RESPONSES,
                field: "output[1]".into()
            })
        );
    }
}

#[test]
fn namespaces_keep_same_named_functions_apart() {
    let json = include_str!("../../../tests/fixtures/providers/openai_responses_namespace.json");
    let calls = parse(json).unwrap();
    assert_eq!(
        calls,
        vec![
            call(
                "call_Ns1crmQ4wE7rT2yU",
                "crm.create_record",
                r#"{"email":"ada@example.com","kind":"contact","name":"Ada Lovelace"}"#,
                0
            ),
            call(
                "call_Ns2bilP9oI3uY6tR",
                "billing.create_record",
                r#"{"amount_cents":125000,"customer":"Ada Lovelace","kind":"invoice"}"#,
                1
            ),
            call(
                "call_Ns3plnZ5xC8vB1nM",
                "create_record",
                r#"{"kind":"note","text":"Met at the conference"}"#,
                2
            ),
        ]
    );
    let ok = result(r#"{"id":"rec_1"}"#, false);
    assert_eq!(
        render_tool_result(&calls[0], &ok).unwrap(),
        r#"{"type":"function_call_output","call_id":"call_Ns1crmQ4wE7rT2yU","name":"create_record","namespace":"crm","output":"{\"id\":\"rec_1\"}"}"#
    );
    assert_eq!(
        render_tool_result(&calls[1], &ok).unwrap(),
        r#"{"type":"function_call_output","call_id":"call_Ns2bilP9oI3uY6tR","name":"create_record","namespace":"billing","output":"{\"id\":\"rec_1\"}"}"#
    );
    assert_eq!(
        render_tool_result(&calls[2], &ok).unwrap(),
        r#"{"type":"function_call_output","call_id":"call_Ns3plnZ5xC8vB1nM","output":"{\"id\":\"rec_1\"}"}"#
    );
}

#[test]
fn dotted_names_are_refused() {
    let dotted_name = response(
        r#"{"type":"function_call","call_id":"call_1","name":"crm.create","arguments":"{}"}"#,
    );
    assert_eq!(
        parse(&dotted_name),
        Err(ProviderError::WrongType {
            provider: RESPONSES,
            field: "output[0].name".into(),
            expected: "name without `.`"
        })
    );
    let dotted_namespace = response(
        r#"{"type":"function_call","call_id":"call_1","namespace":"a.b","name":"c","arguments":"{}"}"#,
    );
    assert_eq!(
        parse(&dotted_namespace),
        Err(ProviderError::WrongType {
            provider: RESPONSES,
            field: "output[0].namespace".into(),
            expected: "name without `.`"
        })
    );
}

#[test]
fn renders_exact_output_items() {
    let weather = call("call_9fKd2LmQ7wZx4TbN", "get_weather", "{}", 0);
    let output = result(r#"{"temp_c": 21.50, "sky": "clear", "delta": -0}"#, false);
    let first = render_tool_result(&weather, &output).unwrap();
    assert_eq!(
        first,
        r#"{"type":"function_call_output","call_id":"call_9fKd2LmQ7wZx4TbN","output":"{\"delta\":-0,\"sky\":\"clear\",\"temp_c\":21.50}"}"#
    );
    assert_eq!(render_tool_result(&weather, &output).unwrap(), first);
}
