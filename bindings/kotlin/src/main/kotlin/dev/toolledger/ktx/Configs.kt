// Builders of the library's configuration records with signed parameters and
// the library's defaults, callable from Java (@JvmOverloads) and Kotlin.
@file:JvmName("Configs")

package dev.toolledger.ktx

import dev.toolledger.BatchMode
import dev.toolledger.EffectClass
import dev.toolledger.ExecutorConfig
import dev.toolledger.LedgerConfig
import dev.toolledger.ToolDescriptor

/**
 * A [LedgerConfig]: [leaseMs] is how long a suspended session stays owner of
 * its calls; [busyTimeoutMs] how long a write waits for another connection;
 * [maxJsonDepth] and [maxJsonBytes] bound the JSON the ledger accepts.
 * The durability policy: with [deferredCommits], the commit of a call whose
 * downstream dedupes by a long-lived key or can be looked up is synced with
 * the next durable write, at `suspend()`, by `sync()` or [deferredDeadlineMs]
 * later; [reconcileWithinMs] is how soon after a restart the app promises to
 * call `recover()` (null: nothing promised). After [idleCheckpointMs] without
 * a write the ledger's own thread copies the write-ahead log into the
 * database file, so no call pays SQLite's checkpoint in its commit (0: never).
 */
@JvmOverloads
fun ledgerConfig(
    leaseMs: Long = 60_000,
    busyTimeoutMs: Long = 5_000,
    maxJsonDepth: Int = 64,
    maxJsonBytes: Long = 1_048_576,
    deferredCommits: Boolean = true,
    deferredDeadlineMs: Long = 1_000,
    reconcileWithinMs: Long? = null,
    idleCheckpointMs: Long = 250,
): LedgerConfig = LedgerConfig(
    leaseMs = leaseMs.toU("leaseMs"),
    busyTimeoutMs = busyTimeoutMs.toU("busyTimeoutMs"),
    maxJsonDepth = maxJsonDepth.toU("maxJsonDepth"),
    maxJsonBytes = maxJsonBytes.toU("maxJsonBytes"),
    deferredCommits = deferredCommits,
    deferredDeadlineMs = deferredDeadlineMs.toU("deferredDeadlineMs"),
    reconcileWithinMs = reconcileWithinMs?.toU("reconcileWithinMs"),
    idleCheckpointMs = idleCheckpointMs.toU("idleCheckpointMs"),
)

/**
 * An [ExecutorConfig]: attempts per call, the time one `perform` may take
 * ([performTimeoutMs], null waits forever), the backoff between attempts,
 * and how many calls of one round run at once.
 */
@JvmOverloads
fun executorConfig(
    maxAttempts: Int = 3,
    readOnlyMaxAttempts: Int = 3,
    performTimeoutMs: Long? = 30_000,
    backoffBaseMs: Long = 200,
    backoffMaxMs: Long = 5_000,
    maxParallel: Int = 4,
): ExecutorConfig = ExecutorConfig(
    maxAttempts = maxAttempts.toU("maxAttempts"),
    readOnlyMaxAttempts = readOnlyMaxAttempts.toU("readOnlyMaxAttempts"),
    performTimeoutMs = performTimeoutMs?.toU("performTimeoutMs"),
    backoffBaseMs = backoffBaseMs.toU("backoffBaseMs"),
    backoffMaxMs = backoffMaxMs.toU("backoffMaxMs"),
    maxParallel = maxParallel.toU("maxParallel"),
)

/**
 * A [ToolDescriptor]: [version] is part of the call's identity;
 * [landingWindowMs] is how long after an unknown outcome a request already
 * sent may still land downstream.
 */
@JvmOverloads
fun toolDescriptor(
    name: String,
    effect: EffectClass = EffectClass.SIDE_EFFECT,
    version: Int = 1,
    batch: BatchMode = BatchMode.ATOMIC,
    idempotencyKey: Boolean = false,
    lookup: Boolean = false,
    requiresApproval: Boolean = false,
    landingWindowMs: Long = 120_000,
): ToolDescriptor = ToolDescriptor(
    name = name,
    version = version.toU("version"),
    effect = effect,
    batch = batch,
    idempotencyKey = idempotencyKey,
    lookup = lookup,
    requiresApproval = requiresApproval,
    landingWindowMs = landingWindowMs.toU("landingWindowMs"),
)
