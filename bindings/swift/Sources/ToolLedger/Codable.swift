import Foundation

/// JSON in and out of the ledger with `Codable` types. The ledger stores
/// arguments and results as JSON text, byte for byte; these helpers encode
/// an `Encodable` into that text and decode it back as a `Decodable`.
public enum LedgerJSON {
    /// The encoder used for arguments and results (sorted keys: the same
    /// value always gives the same text).
    public static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    /// `value` as JSON text.
    public static func encode<T: Encodable>(_ value: T) throws -> String {
        let data = try encoder().encode(value)
        return String(decoding: data, as: UTF8.self)
    }

    /// `json` decoded as `T`.
    public static func decode<T: Decodable>(_ type: T.Type, from json: String) throws -> T {
        try JSONDecoder().decode(type, from: Data(json.utf8))
    }
}

extension ToolCall {
    /// A call the app builds, with its arguments encoded from an `Encodable`.
    public init<Arguments: Encodable>(
        callId: String, toolName: String, arguments: Arguments,
        provider: Provider = .custom, position: UInt32 = 0
    ) throws {
        self.init(provider: provider, callId: callId, toolName: toolName,
                  arguments: try LedgerJSON.encode(arguments), position: position, callIdDerived: false)
    }

    /// The arguments decoded as `T`.
    public func arguments<T: Decodable>(as type: T.Type) throws -> T {
        try LedgerJSON.decode(type, from: arguments)
    }
}

extension ToolRequest {
    /// The arguments (for a batch item: the item) decoded as `T`.
    public func arguments<T: Decodable>(as type: T.Type) throws -> T {
        try LedgerJSON.decode(type, from: argumentsJson)
    }
}

extension PerformOutcome {
    /// `.committed` with the result encoded from an `Encodable`.
    public static func committed<Result: Encodable>(
        _ result: Result, externalId: String? = nil
    ) throws -> PerformOutcome {
        .committed(resultJson: try LedgerJSON.encode(result), externalId: externalId)
    }
}

extension LookupOutcome {
    /// `.found` with the result encoded from an `Encodable`.
    public static func found<Result: Encodable>(
        _ result: Result, externalId: String? = nil
    ) throws -> LookupOutcome {
        .found(resultJson: try LedgerJSON.encode(result), externalId: externalId)
    }
}

extension CallOutcome {
    /// The result decoded as `T` for `.completed`, nil for every other case.
    public func result<T: Decodable>(as type: T.Type) throws -> T? {
        guard case let .completed(_, resultJson, _, _, _) = self else { return nil }
        return try LedgerJSON.decode(type, from: resultJson)
    }
}

extension StoredResult {
    /// The stored result decoded as `T`.
    public func result<T: Decodable>(as type: T.Type) throws -> T {
        try LedgerJSON.decode(type, from: resultJson)
    }
}

extension Execution {
    /// The committed result decoded as `T`, nil while there is none.
    public func result<T: Decodable>(as type: T.Type) throws -> T? {
        guard let resultJson else { return nil }
        return try LedgerJSON.decode(type, from: resultJson)
    }

    /// The arguments decoded as `T`.
    public func arguments<T: Decodable>(as type: T.Type) throws -> T {
        try LedgerJSON.decode(type, from: argsJson)
    }
}
