// swift-tools-version:6.0
//
// The toolledger Swift bindings as a Swift package, with an XCTest suite that
// uses them as an iOS app would. Run it with scripts/test-swift.sh, which
// generates the bindings, copies them in and links the host library:
//
//   Sources/toolledgerFFI/       toolledgerFFI.h + module.modulemap   (generated, not committed)
//   Sources/ToolLedgerBindings/  ToolLedger.swift, the generated API  (generated, not committed)
//   Sources/ToolLedger/          the hand-written layer               (committed)
//   Sources/ToolLedgerQuickStart/ main.swift: README.md's quick start  (copied, not committed)
//   lib/                         libtoolledger.so (or .dylib)         (copied, not committed)
//
// The package names no library path: the test script passes
// `-Xlinker -L<lib> -Xlinker -ltoolledger -Xlinker -rpath -Xlinker <lib>`.
// For apps, the release manifest at the repository root (../../Package.swift)
// packages the same targets with the XCFramework.
import PackageDescription

let package = Package(
    name: "ToolLedger",
    platforms: [.iOS(.v15), .macOS(.v12)],
    products: [
        .library(name: "ToolLedger", targets: ["ToolLedger"]),
    ],
    targets: [
        // The C half of the bindings: the UniFFI scaffolding's header.
        .systemLibrary(name: "toolledgerFFI", path: "Sources/toolledgerFFI"),
        // The generated Swift API, in Swift 5 language mode: Swift 6.0.3
        // crashes compiling it in Swift 6 mode (an assertion in the
        // TransferNonSendable pass on UniFFI 0.32's generated
        // `uniffiTraitInterfaceCallAsyncWithError`; checked with
        // `swift build` in the Linux chroot). Its public types are Sendable,
        // so the Swift 6 code below uses them with full checking.
        .target(
            name: "ToolLedgerBindings",
            dependencies: ["toolledgerFFI"],
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        // `import ToolLedger`: the generated API re-exported plus the
        // hand-written layer (AsyncLedger, Codable helpers, Date accessors),
        // in Swift 6 language mode.
        .target(
            name: "ToolLedger",
            dependencies: ["ToolLedgerBindings"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        // Tools and a fake downstream shared by the tests and the crash child.
        .target(name: "ToolLedgerTestTools", dependencies: ["ToolLedger"]),
        // The process the crash-recovery test SIGKILLs mid-call.
        .executableTarget(name: "ToolLedgerCrashChild", dependencies: ["ToolLedger", "ToolLedgerTestTools"]),
        // README.md's quick start, copied in as written by scripts/test-swift.sh.
        .executableTarget(name: "ToolLedgerQuickStart", dependencies: ["ToolLedger"]),
        .testTarget(
            name: "ToolLedgerTests",
            dependencies: ["ToolLedger", "ToolLedgerTestTools", "ToolLedgerCrashChild", "ToolLedgerQuickStart"]
        ),
    ]
)
