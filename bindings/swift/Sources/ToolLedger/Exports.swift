// The `ToolLedger` module: the UniFFI-generated API (module
// `ToolLedgerBindings`, compiled in Swift 5 language mode, see Package.swift)
// re-exported, plus the hand-written layer in this target (Swift 6 language
// mode): `AsyncLedger` (ledger calls that never block the caller's actor),
// Codable helpers and Date accessors.
//
// There is no AsyncStream of ledger events: the library exposes no event
// source to feed one yet.
@_exported import ToolLedgerBindings
