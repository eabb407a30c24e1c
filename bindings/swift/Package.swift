// swift-tools-version:6.0
//
// The toolledger Swift bindings as a Swift package, with an XCTest suite that
// uses them as an iOS app would. Run it with scripts/test-swift.sh, which
// generates the bindings, copies them in and links the host library:
//
//   Sources/toolledgerFFI/   toolledgerFFI.h + module.modulemap   (generated, not committed)
//   Sources/ToolLedger/      ToolLedger.swift                     (generated, not committed)
//   lib/                     libtoolledger.so (or .dylib)         (copied, not committed)
//
// The package names no library path: the test script passes
// `-Xlinker -L<lib> -Xlinker -ltoolledger -Xlinker -rpath -Xlinker <lib>`.
// For apps, platforms/ios/ packages the same sources with an XCFramework.
import PackageDescription

let package = Package(
    name: "ToolLedger",
    platforms: [.iOS(.v15), .macOS(.v12)],
    products: [
        .library(name: "ToolLedger", targets: ["ToolLedger"]),
        // The ready `os.Logger` adapter for the ledger's observer.
        .library(name: "ToolLedgerLogging", targets: ["ToolLedgerLogging"]),
    ],
    targets: [
        // The C half of the bindings: the UniFFI scaffolding's header.
        .systemLibrary(name: "toolledgerFFI", path: "Sources/toolledgerFFI"),
        // The generated Swift API (`import ToolLedger`). Swift 5 language mode:
        // UniFFI 0.32's generated code keeps global mutable state (handle maps,
        // the initialization check, continuation callbacks) that Swift 6's
        // strict concurrency checking rejects as errors; in Swift 5 mode it
        // compiles cleanly. Its public types are still marked Sendable, so the
        // Swift 6 code below uses them with full checking.
        .target(
            name: "ToolLedger",
            dependencies: ["toolledgerFFI"],
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        // LedgerObserver -> os.Logger (hand-written, committed).
        .target(name: "ToolLedgerLogging", dependencies: ["ToolLedger"]),
        // Tools and a fake downstream shared by the tests and the crash child.
        .target(name: "ToolLedgerTestTools", dependencies: ["ToolLedger"]),
        // The process the crash-recovery test SIGKILLs mid-call.
        .executableTarget(name: "ToolLedgerCrashChild", dependencies: ["ToolLedger", "ToolLedgerTestTools"]),
        .testTarget(
            name: "ToolLedgerTests",
            dependencies: ["ToolLedger", "ToolLedgerLogging", "ToolLedgerTestTools", "ToolLedgerCrashChild"]
        ),
    ]
)
