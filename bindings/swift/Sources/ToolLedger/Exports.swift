// The `ToolLedger` module: the UniFFI-generated API (module
// `ToolLedgerBindings`, compiled in Swift 5 language mode, see Package.swift)
// re-exported, plus the hand-written layer in this target (Swift 6 language
// mode): `AsyncLedger` (ledger calls that never block the caller's actor),
// Codable helpers, Date accessors and `events()`, an AsyncStream of the
// ledger's status moves (no values in them).
@_exported import ToolLedgerBindings
