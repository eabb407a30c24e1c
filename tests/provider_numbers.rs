//! Numbers reach the other side unchanged: any JSON number round-trips byte
//! for byte from the provider payload to the call's arguments, and from the
//! tool's stored result to the rendered message, for every provider.

use proptest::prelude::*;
use toolledger::model::{Provider, ToolCall};
use toolledger::provider::{
    parse_tool_calls, render_mcp_result, render_tool_result, McpProtocol, ParseLimits,
    ToolResultContent,
};

/// A JSON number text: any sign, integer part, fraction and exponent the
/// grammar allows, including forms `serde_json` rewrites (`-0`, `1E2`,
/// integers beyond 64 bits, 17 significant digits, trailing zeros).
fn number() -> impl Strategy<Value = String> {
    let digits = |min: usize, max: usize| prop::collection::vec(0u8..10, min..max);
    let grammar = (
        any::<bool>(),
        prop_oneof![
            Just(vec![0u8]),
            (1u8..10, digits(0, 40)).prop_map(|(first, mut rest)| {
                rest.insert(0, first);
                rest
            })
        ],
        prop::option::of(digits(1, 25)),
        prop::option::of((
            prop_oneof![Just("e"), Just("E")],
            prop_oneof![Just(""), Just("+"), Just("-")],
            0u32..330,
        )),
    )
        .prop_map(|(negative, int, frac, exp)| {
            let mut text = String::new();
            if negative {
                text.push('-');
            }
            text.extend(int.iter().map(|d| char::from(b'0' + d)));
            if let Some(frac) = frac {
                text.push('.');
                text.extend(frac.iter().map(|d| char::from(b'0' + d)));
            }
            if let Some((e, sign, power)) = exp {
                text.push_str(e);
                text.push_str(sign);
                text.push_str(&power.to_string());
            }
            text
        });
    let doubles = any::<f64>()
        .prop_filter("finite", |v| v.is_finite())
        .prop_flat_map(|v| {
            prop_oneof![
                Just(format!("{v}")),
                Just(format!("{v:e}")),
                Just(format!("{v:.16e}")),
                Just(format!("{v:.17}")),
            ]
        });
    let wide = any::<i128>().prop_map(|v| v.to_string());
    prop_oneof![
        4 => grammar,
        3 => doubles,
        1 => wide,
        1 => prop_oneof![Just("-0".to_owned()), Just("-0.0".to_owned()), Just("224.18827276432074".to_owned())],
    ]
    .prop_filter("finite as a double", |text| {
        text.parse::<f64>().is_ok_and(f64::is_finite)
    })
}

/// JSON text of `text` as a JSON string.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// The payload of each provider carrying `args` (a JSON object text) as the
/// arguments of one call.
fn payloads(args: &str) -> Vec<(Provider, String)> {
    vec![
        (
            Provider::OpenAiChat,
            format!(
                r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","tool_calls":[{{"id":"c","type":"function","function":{{"name":"f","arguments":{}}}}}]}},"finish_reason":"tool_calls"}}]}}"#,
                quoted(args)
            ),
        ),
        (
            Provider::OpenAiResponses,
            format!(
                r#"{{"output":[{{"type":"function_call","call_id":"c","name":"f","arguments":{}}}]}}"#,
                quoted(args)
            ),
        ),
        (
            Provider::Anthropic,
            format!(r#"{{"content":[{{"type":"tool_use","id":"c","name":"f","input":{args}}}]}}"#),
        ),
        (
            Provider::Gemini,
            format!(
                r#"{{"candidates":[{{"content":{{"role":"model","parts":[{{"functionCall":{{"id":"c","name":"f","args":{args}}}}}]}}}}]}}"#
            ),
        ),
        (
            Provider::Mcp,
            format!(
                r#"{{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{{"name":"f","arguments":{args}}}}}"#
            ),
        ),
    ]
}

fn parse_one(provider: Provider, payload: &str) -> ToolCall {
    let mut calls = parse_tool_calls(provider, payload, 0, &ParseLimits::default()).unwrap();
    assert_eq!(calls.len(), 1);
    calls.remove(0)
}

fn stored(output_json: String) -> ToolResultContent {
    ToolResultContent {
        output_json,
        is_error: false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arguments_keep_every_number_as_sent(n in number(), m in number()) {
        // Spaced and out of order as a model may send them.
        let args = format!(r#"{{ "n" : {n}, "list": [ {m}, {{"deep": {n}}} ] }}"#);
        let expected = format!(r#"{{"list":[{m},{{"deep":{n}}}],"n":{n}}}"#);
        for (provider, payload) in payloads(&args) {
            prop_assert_eq!(&parse_one(provider, &payload).arguments, &expected, "{}", provider);
        }
    }

    #[test]
    fn results_keep_every_number_as_stored(n in number(), m in number()) {
        let result = format!(r#"{{"v": {n}, "a": [{m}]}}"#);
        let compact = format!(r#"{{"a":[{m}],"v":{n}}}"#);
        let text = quoted(&compact);
        let args = "{}";
        let calls: Vec<ToolCall> = payloads(args)
            .into_iter()
            .map(|(provider, payload)| parse_one(provider, &payload))
            .collect();
        let expected = [
            format!(r#"{{"role":"tool","tool_call_id":"c","content":{text}}}"#),
            format!(r#"{{"type":"function_call_output","call_id":"c","output":{text}}}"#),
            format!(r#"{{"type":"tool_result","tool_use_id":"c","content":{text}}}"#),
            format!(r#"{{"functionResponse":{{"id":"c","name":"f","response":{compact}}}}}"#),
            format!(
                r#"{{"jsonrpc":"2.0","id":"c","result":{{"content":[{{"type":"text","text":{text}}}],"structuredContent":{compact},"isError":false}}}}"#
            ),
        ];
        for (call, expected) in calls.iter().zip(expected) {
            prop_assert_eq!(render_tool_result(call, &stored(result.clone())).unwrap(), expected);
        }
        // A bare number result: as text for the text-only formats, wrapped
        // for Gemini.
        prop_assert_eq!(
            render_tool_result(&calls[0], &stored(n.clone())).unwrap(),
            format!(r#"{{"role":"tool","tool_call_id":"c","content":{}}}"#, quoted(&n))
        );
        prop_assert_eq!(
            render_tool_result(&calls[3], &stored(n.clone())).unwrap(),
            format!(r#"{{"functionResponse":{{"id":"c","name":"f","response":{{"result":{n}}}}}}}"#)
        );
        prop_assert_eq!(
            render_mcp_result(&calls[4], &stored(result.clone()), McpProtocol::V2026_07_28).unwrap(),
            format!(
                r#"{{"jsonrpc":"2.0","id":"c","result":{{"resultType":"complete","content":[{{"type":"text","text":{text}}}],"structuredContent":{compact},"isError":false}}}}"#
            )
        );
    }

    #[test]
    fn mcp_number_ids_come_back_as_sent(id in number()) {
        let request = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"f"}}}}"#
        );
        let call = parse_one(Provider::Mcp, &request);
        prop_assert_eq!(&call.call_id, &id);
        let rendered = render_tool_result(&call, &stored(r#""ok""#.to_owned())).unwrap();
        prop_assert_eq!(
            rendered,
            format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"ok"}}],"isError":false}}}}"#)
        );
    }
}

#[test]
fn the_numbers_named_in_the_issue() {
    // What `serde_json::Value` (default features) makes of them.
    for (sent, serde_json_gives) in [
        ("-0", "-0.0"),
        ("18446744073709551616", "1.8446744073709552e+19"),
        ("224.18827276432074", "224.18827276432071"),
    ] {
        let theirs: serde_json::Value = serde_json::from_str(sent).unwrap();
        assert_eq!(theirs.to_string(), serde_json_gives);
        let args = format!(r#"{{"x":{sent}}}"#);
        for (provider, payload) in payloads(&args) {
            let call = parse_one(provider, &payload);
            assert_eq!(call.arguments, args, "{provider}");
        }
    }
}
