//! The UniFFI binding generator (`uniffi-bindgen`), built from this crate so its version always
//! matches the `uniffi` the library was compiled with.
//!
//! Run it through `scripts/generate-bindings.sh` (library mode: it reads the
//! metadata embedded in `libtoolledger.so` / `.dylib` and `uniffi.toml`).

fn main() {
    uniffi::uniffi_bindgen_main()
}
