//! The CLI and an encrypted ledger: the key comes from the environment
//! (`TOOLLEDGER_KEY`, `TOOLLEDGER_KEY_FILE`), never the command line; without
//! it the ledger is refused with a typed message; the files it writes are the
//! owner's only whatever the umask.

use std::process::Command;

use toolledger::ledger::{Begin, Ledger, LedgerConfig, LedgerKey};
use toolledger_test_support::{op, spec};

const BIN: &str = env!("CARGO_BIN_EXE_toolledger");
const CANARY: &str = "CANARY-cli-4111-1111";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn encrypted_ledger(dir: &std::path::Path) -> (std::path::PathBuf, LedgerKey) {
    let db = dir.join("l.db");
    let key = LedgerKey::generate().unwrap();
    let ledger = Ledger::open_encrypted(&db, LedgerConfig::default(), &key).unwrap();
    let s = spec("c1", "pay", &format!(r#"{{"iban":"{CANARY}"}}"#));
    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    ledger
        .commit(&t.attempt_id(), &format!(r#"{{"r":"{CANARY}"}}"#), None)
        .unwrap();
    (db, key)
}

fn run(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new("sh");
    // umask 022: what a desktop shell has; the export must still be 0600.
    cmd.arg("-c")
        .arg("umask 022; exec \"$0\" \"$@\"")
        .arg(BIN)
        .args(args)
        .env_remove("TOOLLEDGER_KEY")
        .env_remove("TOOLLEDGER_KEY_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn an_encrypted_ledger_is_read_with_the_key_from_the_environment_only() {
    let dir = tempfile::tempdir().unwrap();
    let (db, key) = encrypted_ledger(dir.path());
    let db_s = db.to_str().unwrap();

    let refused = run(&["stats", db_s], &[]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("encrypted"), "{err}");

    let wrong = run(
        &["stats", db_s],
        &[(
            "TOOLLEDGER_KEY",
            &hex(LedgerKey::generate().unwrap().as_bytes()),
        )],
    );
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("does not open"));

    let key_hex = hex(key.as_bytes());
    let stats = run(&["stats", db_s], &[("TOOLLEDGER_KEY", &key_hex)]);
    assert!(
        stats.status.success(),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );

    // From a file, as raw bytes; and values only with --show-args.
    let key_file = dir.path().join("ledger.key");
    std::fs::write(&key_file, key.as_bytes()).unwrap();
    let out = dir.path().join("export.jsonl");
    let export = run(
        &["export", db_s, "--out", out.to_str().unwrap()],
        &[("TOOLLEDGER_KEY_FILE", key_file.to_str().unwrap())],
    );
    assert!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("pay") && !text.contains(CANARY), "{text}");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the export is the owner's only");
    }
    let shown = run(
        &["export", db_s, "--show-args"],
        &[("TOOLLEDGER_KEY", &key_hex)],
    );
    assert!(String::from_utf8_lossy(&shown.stdout).contains(CANARY));
    // The CLI has no option that takes a key.
    let help = run(&["export", "--help"], &[]);
    assert!(!String::from_utf8_lossy(&help.stdout)
        .to_lowercase()
        .contains("--key"));
    // Writes (recover) with the key too.
    let recover = run(&["recover", db_s], &[("TOOLLEDGER_KEY", &key_hex)]);
    assert!(
        recover.status.success(),
        "{}",
        String::from_utf8_lossy(&recover.stderr)
    );
}
