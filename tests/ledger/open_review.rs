//! Review r6: today's fixes to opening files (non-ledger refusal, foreign
//! `-wal`, dangling symlinks, lock probes, error mapping) and to provider
//! parsing.
//!
//! Tests named `defect_*` fail on the code they were written against
//! (each states what must hold); the others pass and stay as probes.

use std::path::Path;

use rusqlite::Connection;
use support::*;
use toolledger::ledger::{Begin, Error, Ledger, LedgerConfig, StorageError};
use toolledger::model::Provider;
use toolledger::provider::{parse_tool_calls, ParseLimits, ProviderError};
use toolledger_test_support as support;

fn sha(path: &Path) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(std::fs::read(path).unwrap()).to_vec()
}

fn answer(r: &Result<Begin, Error>) -> String {
    match r {
        Ok(Begin::Execute(t)) => format!("Execute(attempt {})", t.attempt),
        Ok(Begin::Replay(r)) => format!("Replay({})", r.result_json),
        Ok(other) => format!("{other:?}").chars().take(40).collect(),
        Err(e) => format!("Err({e:?})").chars().take(80).collect(),
    }
}

fn commit_calls(l: &Ledger, tag: &str, range: std::ops::RangeInclusive<u32>) {
    for i in range {
        let t = ticket(
            l.begin(&op("o"), 0, &spec(&format!("{tag}{i}"), "send", "{}"))
                .unwrap(),
        );
        l.commit(&t.attempt_id(), &format!(r#"{{"{tag}":{i}}}"#), None)
            .unwrap();
    }
}

// ---------------------------------------------------------------------------
// refuse_foreign_wal: a -wal of another ledger that does not hold the other
// ledger's `meta` page (the usual case: `meta` is written once at creation
// and checkpointed; a later session's -wal holds only the pages it changed).
// ---------------------------------------------------------------------------

#[test]
#[ignore = "open: found by the twelfth session's review, not fixed yet (RELIABILITY.md, open findings)"]
fn defect_a_foreign_wal_without_the_meta_page_is_applied_silently() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.db");
    {
        let (l, _c) = open_at(&a);
        commit_calls(&l, "a", 1..=3);
    } // closed: checkpointed, a.db holds meta, no -wal left
    {
        let (l, _c) = open_at(&a);
        commit_calls(&l, "a", 4..=6);
        std::mem::forget(l); // killed: these commits are in a.db-wal only
    }
    let b = dir.path().join("b.db");
    {
        let (l, _c) = open_at(&b);
        commit_calls(&l, "b", 1..=3);
    }
    assert!(!dir.path().join("b.db-wal").exists());
    let b_before = sha(&b);
    std::fs::copy(dir.path().join("a.db-wal"), dir.path().join("b.db-wal")).unwrap();
    // What must hold: the foreign -wal is refused (ForeignWal, b.db
    // untouched), or b's committed calls still replay and a's are unknown.
    match Ledger::open(&b, LedgerConfig::default()) {
        Err(e) => assert_eq!(sha(&b), b_before, "refused ({e:?}) but b.db was changed"),
        Ok(l) => {
            let answers: Vec<String> = ["b1", "b2", "b3", "a4"]
                .iter()
                .map(|c| answer(&l.begin(&op("o"), 0, &spec(c, "send", "{}"))))
                .collect();
            assert_eq!(
                answers,
                [
                    r#"Replay({"b":1})"#,
                    r#"Replay({"b":2})"#,
                    r#"Replay({"b":3})"#,
                    "Execute(attempt 1)"
                ],
                "opened b.db through a's -wal"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// refuse_newer: non-ledgers it still adopts, ledgers it refuses.
// ---------------------------------------------------------------------------

#[test]
fn defect_an_sqlite_file_holding_only_a_view_is_adopted_and_modified() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch("CREATE VIEW settings AS SELECT 'dark' AS theme;")
            .unwrap();
    }
    let before = sha(&path);
    let opened = Ledger::open(&path, LedgerConfig::default());
    let ok = opened.is_ok();
    drop(opened);
    // What must hold: the app's database (a schema that is not empty) is
    // refused NotADatabase, byte for byte as it was.
    assert!(!ok && sha(&path) == before, "opened: {ok}");
}

#[test]
fn defect_an_apps_file_with_same_named_tables_and_a_user_version_is_modified() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE operations(id INTEGER PRIMARY KEY, what TEXT);
             CREATE TABLE executions(id INTEGER PRIMARY KEY, op INTEGER);
             CREATE TABLE approvals(id INTEGER PRIMARY KEY, who TEXT);
             INSERT INTO operations VALUES (1, 'backup');
             PRAGMA user_version = 2;",
        )
        .unwrap();
    }
    let before = sha(&path);
    let opened = Ledger::open(&path, LedgerConfig::default());
    let shown = format!("{:?}", opened.as_ref().err());
    let ok = opened.is_ok();
    drop(opened);
    assert!(
        !ok && sha(&path) == before,
        "opened: {ok}, error {shown}, file changed: {}",
        sha(&path) != before
    );
}

#[test]
fn a_ledger_another_session_keeps_open_opens_and_inspects() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (l, _c) = open_at(&path);
    commit_calls(&l, "x", 1..=3);
    // -wal present, meta in the main file only after a checkpoint: both
    // orders of a second open work.
    let second = Ledger::open(&path, LedgerConfig::default());
    assert!(second.is_ok(), "{:?}", second.err());
    drop(second);
    let inspector = toolledger::ledger::Inspector::open(&path);
    assert!(inspector.is_ok(), "{:?}", inspector.err());
}

#[test]
fn a_ledger_path_with_odd_characters_and_a_live_wal_opens() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a b?c#d%25e.db", "ü ñ&=+;,'.db", "x%00y.db"] {
        let path = dir.path().join(name);
        {
            let (l, _c) = open_at(&path);
            commit_calls(&l, "x", 1..=2);
        }
        let (l, _c) = open_at(&path);
        commit_calls(&l, "x", 3..=3);
        // A live -wal with frames, the main file holding meta.
        let second = Ledger::open(&path, LedgerConfig::default());
        assert!(second.is_ok(), "{name}: {:?}", second.err());
        let r = second
            .unwrap()
            .begin(&op("o"), 0, &spec("x3", "send", "{}"));
        assert_eq!(answer(&r), r#"Replay({"x":3})"#, "{name}");
        drop(l);
    }
}

// ---------------------------------------------------------------------------
// Providers: real Chat responses the foreign-message rule must not refuse.
// ---------------------------------------------------------------------------

fn chat(doc: &str) -> Result<Vec<String>, ProviderError> {
    parse_tool_calls(Provider::OpenAiChat, doc, 0, &ParseLimits::default())
        .map(|calls| calls.into_iter().map(|c| c.tool_name).collect())
}

#[test]
fn real_chat_message_shapes_keep_their_calls() {
    let call = r#"[{"id":"call_1","type":"function","function":{"name":"pay","arguments":"{}"}}]"#;
    for message in [
        // content parts (text, refusal), audio, OpenRouter reasoning,
        // Groq executed tools, Azure filter results, Mistral prefix.
        format!(
            r#"{{"role":"assistant","content":[{{"type":"text","text":"ok"}}],"tool_calls":{call}}}"#
        ),
        format!(
            r#"{{"role":"assistant","content":[{{"type":"refusal","refusal":"no"}}],"tool_calls":{call}}}"#
        ),
        format!(
            r#"{{"role":"assistant","content":null,"refusal":null,"audio":{{"id":"a","data":"","expires_at":1,"transcript":""}},"tool_calls":{call}}}"#
        ),
        format!(
            r#"{{"role":"assistant","content":"","reasoning":"r","reasoning_details":[{{"type":"reasoning.text","text":"r"}}],"tool_calls":{call}}}"#
        ),
        format!(
            r#"{{"role":"assistant","content":null,"executed_tools":[{{"type":"function","arguments":"{{}}"}}],"tool_calls":{call}}}"#
        ),
        format!(
            r#"{{"role":"assistant","content":null,"prefix":false,"annotations":[],"tool_calls":{call}}}"#
        ),
        format!(r#"{{"role":null,"content":null,"tool_calls":{call}}}"#),
        format!(r#"{{"content":null,"tool_calls":{call}}}"#),
        format!(
            r#"{{"role":"assistant","content":[{{"type":"thinking","thinking":[{{"type":"text","text":"t"}}]}},{{"type":"text","text":"x"}}],"tool_calls":{call}}}"#
        ),
    ] {
        let doc = format!(
            r#"{{"id":"c","object":"chat.completion","choices":[{{"index":0,"message":{message},"finish_reason":"tool_calls","content_filter_results":{{}}}}]}}"#
        );
        assert_eq!(chat(&doc), Ok(vec!["pay".to_owned()]), "{message}");
    }
}

#[test]
fn storage_error_of_a_refused_view_only_file_is_typed() {
    // Companion to the view probe: whatever is answered is a typed error.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE t(x); PRAGMA user_version = 0;")
            .unwrap();
    }
    let e = Ledger::open(&path, LedgerConfig::default()).err();
    assert!(
        matches!(e, Some(Error::Store(StorageError::NotADatabase))),
        "{e:?}"
    );
}

/// Builds b.db (3 committed calls, closed) with a.db's -wal of a later
/// session (6 calls in a, 3 of them only in the -wal) beside it.
fn b_with_a_later_wal(dir: &Path) -> std::path::PathBuf {
    let a = dir.join("a.db");
    {
        let (l, _c) = open_at(&a);
        commit_calls(&l, "a", 1..=3);
    }
    {
        let (l, _c) = open_at(&a);
        commit_calls(&l, "a", 4..=6);
        std::mem::forget(l);
    }
    let b = dir.join("b.db");
    {
        let (l, _c) = open_at(&b);
        commit_calls(&l, "b", 1..=3);
    }
    std::fs::copy(dir.join("a.db-wal"), dir.join("b.db-wal")).unwrap();
    b
}

#[test]
#[ignore = "open: found by the twelfth session's review, not fixed yet (RELIABILITY.md, open findings)"]
fn defect_the_inspector_reads_a_foreign_wal_as_this_ledgers_records() {
    let dir = tempfile::tempdir().unwrap();
    let b = b_with_a_later_wal(dir.path());
    // What must hold: b.db holds 3 executions; the Inspector either refuses
    // the foreign -wal or shows b's 3, not a's 6.
    match toolledger::ledger::Inspector::open(&b) {
        Err(e) => eprintln!("refused: {e:?}"),
        Ok(i) => assert_eq!(i.execution_count().unwrap(), 3, "a's records shown as b's"),
    }
}

// ---------------------------------------------------------------------------
// Symlinks: a chain of relative dangling links through a symlinked
// directory; a symlinked sessions directory with a live owner.
// ---------------------------------------------------------------------------

#[cfg(unix)]
#[test]
fn a_relative_dangling_chain_through_a_symlinked_directory_names_the_created_file() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    let other = real.join("deep");
    std::fs::create_dir_all(&other).unwrap();
    let links = dir.path().join("links");
    std::fs::create_dir(&links).unwrap();
    // links/sub -> ../real/deep ; links/l1 -> l2 ; links/l2 -> sub/../x.db
    // The kernel resolves sub/.. physically: real/x.db, not links/x.db.
    symlink("../real/deep", links.join("sub")).unwrap();
    symlink("l2", links.join("l1")).unwrap();
    symlink("sub/../x.db", links.join("l2")).unwrap();
    {
        let (l, _c) = open_at(&links.join("l1"));
        commit_calls(&l, "x", 1..=1);
        std::mem::forget(l); // the commit lives in the -wal the ledger named
    }
    let created = std::fs::canonicalize(links.join("l1")).unwrap();
    assert_eq!(created, std::fs::canonicalize(real.join("x.db")).unwrap());
    assert!(!links.join("x.db").exists());
    let wal = format!("{}-wal", created.display());
    assert!(
        Path::new(&wal).exists(),
        "the -wal is beside the file SQLite created"
    );
    let (l, _c) = open_at(&links.join("l1"));
    assert_eq!(
        answer(&l.begin(&op("o"), 0, &spec("x1", "send", "{}"))),
        r#"Replay({"x":1})"#
    );
}

#[cfg(unix)]
#[test]
fn a_dangling_link_loop_and_a_link_to_a_directory_are_cannot_open() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    symlink("loop2", dir.path().join("loop1")).unwrap();
    symlink("loop1", dir.path().join("loop2")).unwrap();
    let e = Ledger::open(&dir.path().join("loop1"), LedgerConfig::default()).err();
    assert!(
        matches!(e, Some(Error::Store(StorageError::CannotOpen))),
        "{e:?}"
    );
    std::fs::create_dir(dir.path().join("d")).unwrap();
    symlink("d", dir.path().join("to_dir")).unwrap();
    let e = Ledger::open(&dir.path().join("to_dir"), LedgerConfig::default()).err();
    assert!(
        matches!(e, Some(Error::Store(StorageError::CannotOpen))),
        "{e:?}"
    );
    assert_eq!(std::fs::read_dir(dir.path().join("d")).unwrap().count(), 0);
}

#[cfg(unix)]
#[test]
fn a_live_owner_behind_a_symlinked_sessions_directory_is_alive() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let elsewhere = dir.path().join("locks");
    std::fs::create_dir(&elsewhere).unwrap();
    symlink(&elsewhere, dir.path().join("l.db-sessions")).unwrap();
    let (a, clock) = open_at(&path);
    let t = ticket(a.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap());
    assert!(std::fs::read_dir(&elsewhere).unwrap().count() >= 1);
    let b = open_with(&path, &clock);
    clock.advance(3_600_000);
    let r = b.begin(&op("o"), 0, &spec("c1", "send", "{}"));
    assert!(answer(&r).starts_with("InFlight"), "{}", answer(&r));
    drop(t);
}

// ---------------------------------------------------------------------------
// refuse_foreign_wal: false refusals of a legit ledger.
// ---------------------------------------------------------------------------

#[test]
fn opens_racing_a_writer_and_its_checkpoints_are_never_foreign_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    {
        let (l, _c) = open_at(&path);
        commit_calls(&l, "seed", 1..=2);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            let (l, _c) = open_at(&path);
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 4000 {
                i += 1;
                commit_calls(&l, &format!("w{i}_"), 1..=1);
                if i.is_multiple_of(5) {
                    let _ = l.checkpoint();
                }
            }
        })
    };
    let started = std::time::Instant::now();
    let mut refusals = Vec::new();
    let mut opens = 0;
    while started.elapsed() < std::time::Duration::from_secs(8) && opens < 300 {
        opens += 1;
        match Ledger::open(&path, LedgerConfig::default()) {
            Ok(l) => drop(l),
            Err(Error::Store(StorageError::Busy)) => {}
            Err(e) => refusals.push(format!("{e:?}")),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(refusals.is_empty(), "{opens} opens: {refusals:?}");
}

#[test]
fn an_encrypted_ledger_after_a_key_rotation_with_a_live_wal_opens() {
    use toolledger::ledger::LedgerKey;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    {
        let (l, _c) = open_at(&path);
        commit_calls(&l, "p", 1..=2);
    }
    let k1 = LedgerKey::generate().unwrap();
    Ledger::encrypt_in_place(&path, LedgerConfig::default(), &k1).unwrap();
    let k2 = LedgerKey::generate().unwrap();
    Ledger::rotate_key(&path, LedgerConfig::default(), &k1, &k2).unwrap();
    let l = Ledger::open_encrypted(&path, LedgerConfig::default(), &k2).unwrap();
    commit_calls(&l, "q", 1..=2);
    let second = Ledger::open_encrypted(&path, LedgerConfig::default(), &k2);
    assert!(second.is_ok(), "{:?}", second.err());
    assert_eq!(
        answer(
            &second
                .unwrap()
                .begin(&op("o"), 0, &spec("p1", "send", "{}"))
        ),
        r#"Replay({"p":1})"#
    );
    std::mem::forget(l);
    let third = Ledger::open_encrypted(&path, LedgerConfig::default(), &k2);
    assert!(third.is_ok(), "after a kill: {:?}", third.err());
    let plain = Ledger::open(&path, LedgerConfig::default()).err();
    assert!(
        matches!(plain, Some(Error::Store(StorageError::KeyRequired))),
        "{plain:?}"
    );
}

// ---------------------------------------------------------------------------
// Providers: Anthropic, Gemini, Responses shapes.
// ---------------------------------------------------------------------------

fn names(provider: Provider, doc: &str) -> Result<Vec<String>, ProviderError> {
    parse_tool_calls(provider, doc, 0, &ParseLimits::default())
        .map(|calls| calls.into_iter().map(|c| c.tool_name).collect())
}

#[test]
fn real_anthropic_bedrock_and_vertex_messages_keep_their_calls() {
    let tool = r#"{"type":"tool_use","id":"toolu_1","name":"pay","input":{"a":1}}"#;
    for doc in [
        format!(
            r#"{{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{tool}],"stop_reason":"tool_use","stop_sequence":null,"usage":{{"input_tokens":1,"output_tokens":1}}}}"#
        ),
        // Bedrock InvokeModel and Vertex rawPredict keep the same body.
        format!(
            r#"{{"type":"message","role":"assistant","content":[{{"type":"text","text":"x"}},{tool}],"stop_reason":"tool_use","container":null}}"#
        ),
        // A bare assistant message (request history), no type.
        format!(r#"{{"role":"assistant","content":[{tool}]}}"#),
        format!(r#"{{"role":"assistant","content":[{tool}],"tool_calls":null}}"#),
    ] {
        assert_eq!(
            names(Provider::Anthropic, &doc),
            Ok(vec!["pay".into()]),
            "{doc}"
        );
    }
}

#[test]
fn a_gemini_turn_that_stopped_keeps_its_calls() {
    let call = r#"{"functionCall":{"name":"pay","args":{"a":1}}}"#;
    let doc = format!(
        r#"{{"candidates":[{{"content":{{"role":"model","parts":[{call}]}},"finishReason":"STOP","index":0}}],"usageMetadata":{{}},"modelVersion":"gemini"}}"#
    );
    assert_eq!(names(Provider::Gemini, &doc), Ok(vec!["pay".into()]));
}

#[test]
fn defect_a_responses_response_still_in_progress_hands_out_its_calls() {
    // A background-mode response polled before it ended: it may still end
    // `failed` or `cancelled`, whose calls are not to be run (row 50).
    let item = r#"{"type":"function_call","id":"fc_1","call_id":"call_1","name":"pay","arguments":"{}","status":"completed"}"#;
    for status in ["in_progress", "queued"] {
        let doc = format!(
            r#"{{"id":"resp_1","object":"response","status":"{status}","background":true,"output":[{item}]}}"#
        );
        let got = names(Provider::OpenAiResponses, &doc);
        // What must hold: no call is handed out before the response ended.
        assert!(
            matches!(got, Err(ProviderError::IncompleteCall { .. })),
            "{status}: {got:?}"
        );
    }
}

#[test]
fn a_gemini_unspecified_or_missing_finish_reason_runs_no_call() {
    let call = r#"{"functionCall":{"name":"pay","args":{"a":1}}}"#;
    for reason in [
        r#","finishReason":"FINISH_REASON_UNSPECIFIED""#,
        "",
        r#","finishReason":"""#,
    ] {
        let doc = format!(
            r#"{{"candidates":[{{"content":{{"role":"model","parts":[{call}]}}{reason}}}]}}"#
        );
        let got = names(Provider::Gemini, &doc);
        assert!(
            matches!(got, Err(ProviderError::IncompleteCall { .. })),
            "{doc}: {got:?}"
        );
    }
}

#[test]
fn a_backup_restored_under_a_later_generations_wal_is_not_a_mixed_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    {
        let (l, _c) = open_at(&path);
        commit_calls(&l, "c", 1..=3);
    }
    let backup = dir.path().join("backup.db");
    std::fs::copy(&path, &backup).unwrap();
    {
        let (l, _c) = open_at(&path);
        commit_calls(&l, "c", 4..=6);
    }
    {
        let (l, _c) = open_at(&path);
        commit_calls(&l, "c", 7..=9);
        std::mem::forget(l); // killed: 7..9 only in the -wal
    }
    // The app restores its backup of the database file; the -wal stays.
    std::fs::copy(&backup, &path).unwrap();
    let before = sha(&path);
    // What must hold: refused with a typed error and the file untouched, or
    // a consistent ledger: every call the opened file says is committed
    // replays, and no call reads as committed that the file's own state
    // (1..3) or the -wal's (1..9) would not show.
    match Ledger::open(&path, LedgerConfig::default()) {
        Err(e) => {
            eprintln!("restored backup: refused {e:?}");
            assert_eq!(sha(&path), before, "refused ({e:?}) but the file changed")
        }
        Ok(l) => {
            let answers: Vec<String> = (1..=9)
                .map(|i| answer(&l.begin(&op("o"), 0, &spec(&format!("c{i}"), "send", "{}"))))
                .collect();
            eprintln!("restored backup: {answers:?}");
            let replays = answers.iter().filter(|a| a.starts_with("Replay")).count();
            assert!(
                (replays == 3 && answers[..3].iter().all(|a| a.starts_with("Replay")))
                    || replays == 9,
                "a mixed state: {answers:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// write_exact: every number that digested before today's change digests the
// same (the pre-change function, copied from 19c8c90^, as the oracle).
// ---------------------------------------------------------------------------

fn old_write_exact(out: &mut String, text: &str) -> bool {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.split_once(['e', 'E']) {
        Some((m, e)) => match e.strip_prefix('+').unwrap_or(e).parse::<i32>() {
            Ok(exp) => (m, i64::from(exp)),
            Err(_) => return false,
        },
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = int.bytes().chain(frac.bytes());
    let mut n = i64::try_from(int.len()).unwrap_or(i64::MAX) + exp;
    let mut digits: Vec<u8> = Vec::new();
    for d in all {
        if digits.is_empty() && d == b'0' {
            n -= 1;
        } else {
            digits.push(d);
        }
    }
    while digits.last() == Some(&b'0') {
        digits.pop();
    }
    if digits.is_empty() {
        out.push('0');
        return true;
    }
    if negative {
        out.push('-');
    }
    let k = i64::try_from(digits.len()).unwrap();
    let digit_chars = digits.iter().map(|&d| char::from(d));
    if k <= n && n <= 21 {
        out.extend(digit_chars);
        out.extend((k..n).map(|_| '0'));
    } else if 0 < n && n <= 21 {
        for (i, d) in (0..).zip(digit_chars) {
            if i == n {
                out.push('.');
            }
            out.push(d);
        }
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend((n..0).map(|_| '0'));
        out.extend(digit_chars);
    } else {
        for (i, d) in digit_chars.enumerate() {
            if i == 1 {
                out.push('.');
            }
            out.push(d);
        }
        let exp = n - 1;
        out.push('e');
        out.push(if exp > 0 { '+' } else { '-' });
        out.push_str(&exp.unsigned_abs().to_string());
    }
    true
}

#[test]
fn every_number_that_digested_before_digests_the_same() {
    use toolledger::model::canonical::canonicalize;
    use toolledger::model::JsonLimits;
    let limits = JsonLimits::default();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    let digit_run = |len: u64, next: &mut dyn FnMut(u64) -> u64| -> String {
        (0..len)
            .map(|_| char::from(b'0' + next(10) as u8))
            .collect()
    };
    let exps = [
        "",
        "e0",
        "e+0",
        "e-0",
        "e1",
        "e-1",
        "e21",
        "e-7",
        "e20",
        "e-6",
        "e308",
        "e-324",
        "e-400",
        "e2147483647",
        "e-2147483648",
        "e0000005",
        "E+22",
        "e-2147483647",
    ];
    let mut compared = 0;
    for _ in 0..60_000 {
        let sign = if next(2) == 0 { "-" } else { "" };
        let int_len = 1 + next(25);
        let mut int = digit_run(int_len, &mut next);
        if int.len() > 1 && next(3) > 0 {
            int = format!("0{}", &int[1..]); // invalid JSON leading zero: fix below
        }
        if int.len() > 1 && int.starts_with('0') {
            int = int.trim_start_matches('0').to_owned();
            if int.is_empty() {
                int = "0".into();
            }
        }
        let frac = if next(2) == 0 {
            format!(".{}", digit_run(1 + next(25), &mut next))
        } else {
            String::new()
        };
        let exp = if next(3) == 0 {
            exps[next(exps.len() as u64) as usize].to_owned()
        } else {
            format!("e{}{}", ["", "+", "-"][next(3) as usize], next(400))
        };
        let text = format!("{sign}{int}{frac}{exp}");
        let mut old = String::new();
        if !old_write_exact(&mut old, &text) {
            continue;
        }
        let v: f64 = text.parse().unwrap();
        if !v.is_finite() {
            continue;
        }
        compared += 1;
        let now = canonicalize(&text, &limits).unwrap_or_else(|e| panic!("{text}: {e:?}"));
        assert_eq!(now, old, "{text}");
    }
    assert!(compared > 30_000, "{compared}");
}

/// Child: commits calls into the ledger named by TOOLLEDGER_R6_DB, with a
/// checkpoint every few, for TOOLLEDGER_R6_MS milliseconds.
#[test]
fn child_open_review_writer() {
    let Ok(db) = std::env::var("TOOLLEDGER_R6_DB") else {
        return;
    };
    let ms: u64 = std::env::var("TOOLLEDGER_R6_MS").unwrap().parse().unwrap();
    let (l, _c) = open_at(Path::new(&db));
    let started = std::time::Instant::now();
    let mut i = 0u32;
    while started.elapsed() < std::time::Duration::from_millis(ms) {
        i += 1;
        commit_calls(&l, &format!("w{i}_"), 1..=1);
        if i.is_multiple_of(3) {
            let _ = l.checkpoint();
        }
    }
}

#[test]
fn opens_racing_another_process_writing_and_checkpointing_are_never_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    {
        let (l, _c) = open_at(&path);
        commit_calls(&l, "seed", 1..=2);
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "open_review::child_open_review_writer",
            "--exact",
            "--test-threads=1",
        ])
        .env("TOOLLEDGER_R6_DB", &path)
        .env("TOOLLEDGER_R6_MS", "5000")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let started = std::time::Instant::now();
    let (mut opens, mut busy, mut refusals) = (0, 0, Vec::new());
    while started.elapsed() < std::time::Duration::from_secs(4) {
        opens += 1;
        match Ledger::open(&path, LedgerConfig::default()) {
            Ok(l) => drop(l),
            Err(Error::Store(StorageError::Busy)) => busy += 1,
            Err(e) => refusals.push(format!("{e:?}")),
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let written = toolledger::ledger::Inspector::open(&path)
        .unwrap()
        .execution_count()
        .unwrap();
    eprintln!("cross-process: {opens} opens, {busy} busy, {written} executions");
    assert!(written > 50, "the child wrote {written}");
    assert!(refusals.is_empty(), "{opens} opens: {refusals:?}");
}

#[test]
#[ignore = "open: found by the twelfth session's review, not fixed yet (RELIABILITY.md, open findings)"]
fn defect_after_an_open_over_a_foreign_wal_the_database_file_itself_holds_the_other_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let b = b_with_a_later_wal(dir.path());
    let opened = Ledger::open(&b, LedgerConfig::default());
    let refused = opened.is_err();
    drop(opened); // closing checkpoints the -wal into b.db
    let _ = std::fs::remove_file(dir.path().join("b.db-wal"));
    let _ = std::fs::remove_file(dir.path().join("b.db-shm"));
    let count = toolledger::ledger::Inspector::open(&b)
        .unwrap()
        .execution_count()
        .unwrap();
    // What must hold: moving the foreign -wal away gives back b's 3 calls.
    assert_eq!(
        count, 3,
        "refused at open: {refused}; b.db now holds a's records"
    );
}
