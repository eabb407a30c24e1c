// swift-tools-version:6.0
//
// ToolLedger for iOS apps: the Rust core as a static XCFramework plus the
// UniFFI-generated Swift API. Both are build products, not committed: run
// ./build-xcframework.sh on a Mac first (see README.md). Then add this
// directory as a local package in Xcode and `import ToolLedger`.
import PackageDescription

let package = Package(
    name: "ToolLedger",
    platforms: [.iOS(.v15)],
    products: [
        .library(name: "ToolLedger", targets: ["ToolLedger"]),
    ],
    targets: [
        // libtoolledger.a per platform (device; simulator arm64 + x86_64)
        // with Headers/{toolledgerFFI.h, module.modulemap}.
        .binaryTarget(name: "toolledgerFFI", path: "ToolLedgerFFI.xcframework"),
        // The generated Swift API. Swift 5 language mode: the generated code
        // does not compile in Swift 6 mode (see bindings/swift/Package.swift);
        // apps using it may be in Swift 6 mode, its public types are Sendable.
        .target(
            name: "ToolLedger",
            dependencies: ["toolledgerFFI"],
            path: "Sources/ToolLedger",
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
    ]
)
