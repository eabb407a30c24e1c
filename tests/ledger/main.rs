//! The library's integration tests: one test binary, one module per
//! capability (each covers the ledger API and the executor for that
//! capability). Two long proof runs, sized by environment variables, are
//! binaries of their own: the seeded simulation of live owners
//! (`tests/simulation.rs`) and the power cuts of the durability policy
//! (`tests/power_loss/`).
//!
//! Helpers shared with the torture harness live in `tests/support`
//! (package `toolledger-test-support`).

mod abandoned_attempts;
mod approval;
mod approvals_review;
mod attention;
mod bad_input;
mod batches;
mod caller_driven;
mod caller_rounds;
mod cancellation;
mod concurrency;
mod crash_recovery;
mod delivery;
mod encryption;
mod encryption_review;
mod file_review;
mod fixes12_review;
mod fixes_review;
mod flows;
mod idempotency;
mod in_place;
mod inspect;
mod jobs_and_webhooks;
mod late_reports;
mod latest_review;
mod lifecycle_races;
mod live_owners;
mod lock_files;
mod migrations;
mod open_review;
mod ownership;
mod privacy;
mod provider_review;
mod providers;
mod read_only;
mod reconciliation;
mod reentrancy_review;
mod retention;
mod retention_review;
mod rev13_review;
mod rev13b_review;
mod rev13c_review;
mod rev13d_review;
mod rev13e_review;
mod rev13f_review;
mod rev13g_review;
mod round_faults;
mod sqlite_build;
mod storage_faults;
mod text_sizes;
mod text_sizes_review;
