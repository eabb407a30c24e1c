// README.md's quick start, run as a user runs it: the executable
// ToolLedgerQuickStart (the README's block, copied in as written by
// scripts/test-swift.sh) in an empty directory must print exactly the
// README's output block.

import Foundation
import XCTest

final class QuickStartTests: XCTestCase {
    func testTheReadmeQuickStartPrintsWhatTheReadmeSays() throws {
        let readme = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("README.md")
        let text = try String(contentsOf: readme, encoding: .utf8)
        let afterHeading = try XCTUnwrap(text.range(of: "## Quick start")).upperBound
        let afterCode = try XCTUnwrap(text.range(of: "```\n\n```text\n", range: afterHeading..<text.endIndex))
        let end = try XCTUnwrap(text.range(of: "```", range: afterCode.upperBound..<text.endIndex))
        let expected = String(text[afterCode.upperBound..<end.lowerBound])

        let dir = try scratchDirectory()
        let process = Process()
        process.executableURL = try executable("ToolLedgerQuickStart")
        process.currentDirectoryURL = URL(fileURLWithPath: dir)
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        XCTAssertEqual(process.terminationStatus, 0)
        XCTAssertEqual(String(decoding: data, as: UTF8.self), expected)
    }

    /// An executable of this package, built next to the test bundle.
    private func executable(_ name: String) throws -> URL {
        let bundle = Bundle(for: QuickStartTests.self).bundleURL
        let candidates = [
            bundle.appendingPathComponent(name),  // Linux: the bundle URL is the build dir
            bundle.deletingLastPathComponent().appendingPathComponent(name),  // macOS: …/X.xctest
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
                .appendingPathComponent(name),
        ]
        return try XCTUnwrap(
            candidates.first { FileManager.default.isExecutableFile(atPath: $0.path) },
            "\(name) not found in \(candidates.map(\.path))")
    }
}
