//! toolledger: a durable on-device ledger that makes AI tool calls effectively once.
#![warn(missing_docs)]

pub mod crashpoint;
pub mod executor;
pub mod ffi;
pub mod ledger;
pub mod model;
pub mod provider;
pub mod store;

// UniFFI scaffolding (the `UniFfiTag` its derives in `ffi` refer to) must sit
// at the crate root.
uniffi::setup_scaffolding!();
