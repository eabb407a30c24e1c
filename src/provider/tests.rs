//! Cross-provider tests: limits, unsupported providers, privacy of errors and
//! deterministic rendering. Per-format tests live next to each format.

use super::*;

const OPENAI_CHAT: &str = include_str!("../../tests/fixtures/providers/openai_chat_parallel.json");
const OPENAI_RESPONSES: &str =
    include_str!("../../tests/fixtures/providers/openai_responses_parallel.json");
const ANTHROPIC: &str = include_str!("../../tests/fixtures/providers/anthropic_parallel.json");
const GEMINI: &str = include_str!("../../tests/fixtures/providers/gemini_parallel_no_ids.json");
const MCP: &str = include_str!("../../tests/fixtures/providers/mcp_batch.json");

/// Every provider with its multi-call fixture.
fn all() -> [(Provider, &'static str); 5] {
    [
        (Provider::OpenAiChat, OPENAI_CHAT),
        (Provider::OpenAiResponses, OPENAI_RESPONSES),
        (Provider::Anthropic, ANTHROPIC),
        (Provider::Gemini, GEMINI),
        (Provider::Mcp, MCP),
    ]
}

/// A tool result as the renderers take it (shared by the per-format tests).
pub(super) fn result(output_json: &str, is_error: bool) -> ToolResultContent {
    ToolResultContent {
        output_json: output_json.into(),
        is_error,
    }
}

/// A parsed call as the parsers should produce it (shared by the per-format
/// tests).
pub(super) fn tool_call(
    provider: Provider,
    id: &str,
    derived: bool,
    name: &str,
    args: &str,
    position: u32,
) -> ToolCall {
    ToolCall {
        provider,
        call_id: id.into(),
        call_id_derived: derived,
        tool_name: name.into(),
        arguments: args.into(),
        position,
    }
}

#[test]
fn defaults() {
    let limits = ParseLimits::default();
    assert_eq!(limits.max_bytes, 4 * 1024 * 1024);
    assert_eq!(limits.max_calls, 128);
}

#[test]
fn five_mib_is_too_large_before_parsing() {
    // Not even JSON: the size check must come first.
    let huge = "x".repeat(5 * 1024 * 1024);
    for (provider, _) in all() {
        assert_eq!(
            parse_tool_calls(provider, &huge, 0, &ParseLimits::default()),
            Err(ProviderError::TooLarge {
                provider,
                size: 5 * 1024 * 1024,
                max: DEFAULT_MAX_BYTES
            })
        );
    }
    let exact = ParseLimits {
        max_bytes: ANTHROPIC.len(),
        ..ParseLimits::default()
    };
    assert_eq!(
        parse_tool_calls(Provider::Anthropic, ANTHROPIC, 0, &exact)
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn too_many_calls_for_every_provider() {
    let limits = ParseLimits {
        max_calls: 2,
        ..ParseLimits::default()
    };
    for (provider, json) in all() {
        let expected = if provider == Provider::OpenAiResponses {
            2
        } else {
            3
        };
        let outcome = parse_tool_calls(provider, json, 0, &limits);
        if expected > 2 {
            assert_eq!(
                outcome,
                Err(ProviderError::TooManyCalls {
                    provider,
                    count: 3,
                    max: 2
                }),
                "{provider}"
            );
        } else {
            assert_eq!(outcome.unwrap().len(), 2);
        }
    }
}

#[test]
fn positions_count_calls_only() {
    for (provider, json) in all() {
        let calls = parse_tool_calls(provider, json, 0, &ParseLimits::default()).unwrap();
        let positions: Vec<u32> = calls.iter().map(|call| call.position).collect();
        let expected: Vec<u32> = (0..u32::try_from(calls.len()).unwrap()).collect();
        assert_eq!(positions, expected, "{provider}");
        assert!(calls.iter().all(|call| call.provider == provider));
    }
}

#[test]
fn custom_is_unsupported() {
    let limits = ParseLimits::default();
    assert_eq!(
        parse_tool_calls(Provider::Custom, "{}", 0, &limits),
        Err(ProviderError::Unsupported {
            provider: Provider::Custom
        })
    );
    let call = ToolCall::custom("c1", "scripted", "{}");
    assert_eq!(
        render_tool_result(&call, &result("{}", false)),
        Err(ProviderError::Unsupported {
            provider: Provider::Custom
        })
    );
}

#[test]
fn invalid_documents() {
    let limits = ParseLimits::default();
    for (provider, _) in all() {
        assert!(
            matches!(
                parse_tool_calls(provider, "{\"choices\": [", 0, &limits),
                Err(ProviderError::InvalidJson { provider: p, .. }) if p == provider
            ),
            "{provider}"
        );
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(matches!(
            parse_tool_calls(provider, &deep, 0, &limits),
            Err(ProviderError::InvalidJson { .. })
        ));
    }
    assert_eq!(
        parse_tool_calls(Provider::Anthropic, "[1]", 0, &limits),
        Err(ProviderError::WrongType {
            provider: Provider::Anthropic,
            field: "$".into(),
            expected: "object"
        })
    );
    let deep_args = format!(
        r#"{{"role":"assistant","tool_calls":[{{"id":"c","type":"function","function":{{"name":"f","arguments":"{}"}}}}]}}"#,
        "[".repeat(500)
    );
    assert!(matches!(
        parse_tool_calls(Provider::OpenAiChat, &deep_args, 0, &limits),
        Err(ProviderError::ArgumentsNotJson { .. })
    ));
}

#[test]
fn errors_never_repeat_values() {
    let limits = ParseLimits::default();
    let bad = include_str!("../../tests/fixtures/providers/openai_chat_bad_arguments.json");
    let err = parse_tool_calls(Provider::OpenAiChat, bad, 0, &limits).unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(
        !text.contains("sam@example.com") && !text.contains("Invoice"),
        "{text}"
    );
    let secret = result("{\"token\": sk-live-123}", false);
    let call = ToolCall {
        provider: Provider::OpenAiChat,
        ..ToolCall::custom("call_1", "f", "{}")
    };
    let err = render_tool_result(&call, &secret).unwrap_err();
    assert!(matches!(
        err,
        ProviderError::ResultNotJson {
            provider: Provider::OpenAiChat,
            ..
        }
    ));
    assert!(!format!("{err} {err:?}").contains("sk-live"));
}

#[test]
fn rendering_is_deterministic_for_every_provider() {
    let outputs = [
        result(
            r#"{"status": "ok", "ids": [3, 1, 2], "note": "Grüße 👋"}"#,
            false,
        ),
        result(r#""plain text result""#, false),
        result(r#"{"error": "timeout", "retryable": true}"#, true),
        result("null", false),
    ];
    for (provider, json) in all() {
        let calls = parse_tool_calls(provider, json, 4, &ParseLimits::default()).unwrap();
        for call in &calls {
            for output in &outputs {
                let first = render_tool_result(call, output).unwrap();
                let again = render_tool_result(call, output).unwrap();
                assert_eq!(first, again, "{provider}");
                // A re-parse of the same response renders the same bytes too.
                let reparsed = parse_tool_calls(provider, json, 4, &ParseLimits::default())
                    .unwrap()
                    .remove(usize::try_from(call.position).unwrap());
                assert_eq!(render_tool_result(&reparsed, output).unwrap(), first);
                let _: serde_json::Value = serde_json::from_str(&first).unwrap();
            }
        }
        // Whitespace in the stored result does not change the rendering.
        let spaced = result("{ \"a\" : 1 ,\n \"b\" : [ true ] }", false);
        let tight = result(r#"{"a":1,"b":[true]}"#, false);
        assert_eq!(
            render_tool_result(&calls[0], &spaced).unwrap(),
            render_tool_result(&calls[0], &tight).unwrap()
        );
    }
}

#[test]
fn turn_helpers_check_their_input() {
    let calls = parse_tool_calls(Provider::Gemini, GEMINI, 0, &ParseLimits::default()).unwrap();
    let ok = result("{}", false);
    assert_eq!(
        render_anthropic_user_message(&[(&calls[0], &ok)]),
        Err(ProviderError::ProviderMismatch {
            expected: Provider::Anthropic,
            found: Provider::Gemini
        })
    );
    assert_eq!(
        render_gemini_user_turn(&[]),
        Err(ProviderError::NoResults {
            provider: Provider::Gemini
        })
    );
    assert_eq!(
        render_mcp_batch_response(&[(&calls[0], &ok)]),
        Err(ProviderError::ProviderMismatch {
            expected: Provider::Mcp,
            found: Provider::Gemini
        })
    );
    assert!(matches!(
        render_gemini_user_turn(&[(&calls[0], &result("not json", false))]),
        Err(ProviderError::ResultNotJson {
            provider: Provider::Gemini,
            ..
        })
    ));
}

#[test]
fn duplicate_keys_are_rejected_not_collapsed() {
    let limits = ParseLimits::default();
    let anthropic = r#"{"content":[{"type":"tool_use","id":"toolu_1","name":"pay",
        "input":{"amount":1,"amount":1000}}]}"#;
    assert!(matches!(
        parse_tool_calls(Provider::Anthropic, anthropic, 0, &limits),
        Err(ProviderError::InvalidJson { ref reason, .. }) if reason.starts_with("duplicate object key")
    ));
    let chat = r#"{"role":"assistant","tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"pay","arguments":"{\"amount\":1,\"amount\":1000}"}}]}"#;
    assert!(matches!(
        parse_tool_calls(Provider::OpenAiChat, chat, 0, &limits),
        Err(ProviderError::ArgumentsNotJson { ref field, ref reason, .. })
            if field == "tool_calls[0].function.arguments" && !reason.contains("1000")
    ));
    let call = ToolCall {
        provider: Provider::Anthropic,
        ..ToolCall::custom("toolu_1", "pay", "{}")
    };
    assert!(matches!(
        render_tool_result(&call, &result(r#"{"ok":true,"ok":false}"#, false)),
        Err(ProviderError::ResultNotJson { .. })
    ));
}
