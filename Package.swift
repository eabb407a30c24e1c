// swift-tools-version:6.0
//
// The ToolLedger Swift package, as an app adds it by URL (Xcode: File > Add
// Package Dependencies..., or `.package(url: <this repository>, from:
// "<version>")`), at a release tag. platforms/ios/release.sh makes a
// release: it builds the XCFramework (iOS device, iOS simulator, macOS),
// zips it, writes the zip's URL and SHA-256 checksum into `releaseURL` and
// `releaseChecksum` below, and writes the generated Swift into
// platforms/ios/Sources/ToolLedgerBindings/, which is committed with the
// tag. Between releases the generated Swift is absent on the main branch:
// use a tag. For a local build, set TOOLLEDGER_LOCAL_XCFRAMEWORK=1 and the
// binary target is the XCFramework release.sh left in platforms/ios/build/.
//
// Targets:
//   toolledgerFFI       the Rust library (static, per platform) with its C
//                       header and module map under Headers/toolledgerFFI/
//   ToolLedgerBindings  the UniFFI-generated Swift (Swift 5 language mode:
//                       Swift 6.0.3 crashes on it in Swift 6 mode, see
//                       bindings/swift/Package.swift)
//   ToolLedger          the hand-written layer (Swift 6 language mode),
//                       re-exporting the generated API: `import ToolLedger`
import Foundation
import PackageDescription

let releaseURL = "https://example.invalid/toolledger/releases/download/0.0.0/ToolLedgerFFI.xcframework.zip"
let releaseChecksum = "0000000000000000000000000000000000000000000000000000000000000000"

let ffi: Target = Context.environment["TOOLLEDGER_LOCAL_XCFRAMEWORK"] == nil
    ? .binaryTarget(name: "toolledgerFFI", url: releaseURL, checksum: releaseChecksum)
    : .binaryTarget(name: "toolledgerFFI", path: "platforms/ios/build/ToolLedgerFFI.xcframework")

let package = Package(
    name: "ToolLedger",
    platforms: [.iOS(.v15), .macOS(.v12)],
    products: [
        .library(name: "ToolLedger", targets: ["ToolLedger"]),
    ],
    targets: [
        ffi,
        .target(
            name: "ToolLedgerBindings",
            dependencies: ["toolledgerFFI"],
            path: "platforms/ios/Sources/ToolLedgerBindings",
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .target(
            name: "ToolLedger",
            dependencies: ["ToolLedgerBindings"],
            path: "bindings/swift/Sources/ToolLedger",
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
    ]
)
