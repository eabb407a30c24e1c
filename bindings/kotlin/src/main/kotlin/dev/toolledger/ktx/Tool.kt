package dev.toolledger.ktx

import dev.toolledger.LookupOutcome
import dev.toolledger.PerformOutcome
import dev.toolledger.ToolDescriptor
import dev.toolledger.ToolHandler
import dev.toolledger.ToolRequest

/**
 * A [ToolHandler] with defaults: the descriptor is given once, [lookup]
 * answers `Unsupported` and [approvalPreview] none, so a read-only tool
 * implements [perform] only:
 *
 * ```kotlin
 * class Weather : Tool(toolDescriptor("weather", EffectClass.READ_ONLY)) {
 *     override suspend fun perform(request: ToolRequest) =
 *         PerformOutcome.Committed(resultJson = """{"celsius":21}""", externalId = null)
 * }
 * ```
 *
 * A tool that overrides [lookup] must say so in its descriptor
 * (`lookup = true`). Keep subclasses immutable (`val`s): the library calls
 * them from its own threads.
 */
abstract class Tool(private val descriptor: ToolDescriptor) : ToolHandler {
    final override fun descriptor(): ToolDescriptor = descriptor

    override suspend fun lookup(request: ToolRequest): LookupOutcome = LookupOutcome.Unsupported

    override fun approvalPreview(argumentsJson: String): String? = null

    abstract override suspend fun perform(request: ToolRequest): PerformOutcome
}
