//! The bundled SQLite is built with the compile options that
//! `.cargo/config.toml` gives it (`LIBSQLITE3_FLAGS`): a build that lost
//! them still works, only slower, so nothing else would notice.

/// The options `.cargo/config.toml` sets; a build under another value of
/// `LIBSQLITE3_FLAGS` (set by the environment) is not this check's business.
const CONFIGURED: &str = "-USQLITE_ENABLE_MEMORY_MANAGEMENT -DSQLITE_OMIT_SHARED_CACHE";

fn compile_options() -> Vec<String> {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    let mut stmt = conn.prepare("PRAGMA compile_options").unwrap();
    stmt.query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
#[cfg(not(target_vendor = "apple"))]
fn the_bundled_sqlite_has_no_global_page_cache_mutex_and_no_shared_cache() {
    if option_env!("LIBSQLITE3_FLAGS") != Some(CONFIGURED) {
        println!(
            "SKIPPED: LIBSQLITE3_FLAGS is {:?}, not the workspace's",
            option_env!("LIBSQLITE3_FLAGS")
        );
        return;
    }
    let options = compile_options();
    // The bundled build's own defaults are there (this is the bundled copy).
    assert!(options.iter().any(|o| o == "ENABLE_FTS5"), "{options:?}");
    assert!(
        !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
        "{options:?}"
    );
    assert!(
        options.iter().any(|o| o == "OMIT_SHARED_CACHE"),
        "{options:?}"
    );
}
