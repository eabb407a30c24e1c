// A fake remote service for the tests and the crash child: every effect it
// performs is one file in a directory, so tests can count real side effects
// across processes, and `find` can look an effect up by its downstream key
// as a real service would. It does no deduplication of its own.

import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

public final class Downstream: Sendable {
    /// The directory holding one `effect-<n>` file per effect.
    public let directory: String

    public init(directory: String) throws {
        self.directory = directory
        try FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true)
    }

    /// Performs one effect under `key` and returns its id (`msg_<n>`). Safe
    /// across threads and processes: each effect claims the next number with
    /// an exclusive create.
    public func perform(key: String) throws -> String {
        var n = try count() + 1
        while true {
            let path = "\(directory)/effect-\(n)"
            let fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0o644)
            if fd >= 0 {
                let bytes = Array(key.utf8)
                let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                let synced = fsync(fd)
                close(fd)
                guard written == bytes.count, synced == 0 else {
                    throw DownstreamError.writeFailed(errno)
                }
                return "msg_\(n)"
            }
            guard errno == EEXIST else { throw DownstreamError.writeFailed(errno) }
            n += 1
        }
    }

    /// The id of the first effect performed under `key`, if any.
    public func find(key: String) throws -> String? {
        for n in try numbers() {
            let data = try Data(contentsOf: URL(fileURLWithPath: "\(directory)/effect-\(n)"))
            if String(decoding: data, as: UTF8.self) == key { return "msg_\(n)" }
        }
        return nil
    }

    /// How many effects were performed.
    public func count() throws -> Int { try numbers().count }

    private func numbers() throws -> [Int] {
        try FileManager.default.contentsOfDirectory(atPath: directory)
            .compactMap { name in
                name.hasPrefix("effect-") ? Int(name.dropFirst("effect-".count)) : nil
            }
            .sorted()
    }
}

public enum DownstreamError: Error {
    case writeFailed(Int32)
}
