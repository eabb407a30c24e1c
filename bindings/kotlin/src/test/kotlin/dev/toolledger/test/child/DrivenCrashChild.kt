// The child JVM of the caller-driven crash test:
//
//     java -cp <the suite's classpath> dev.toolledger.test.child.DrivenCrashChildKt LEDGER_DB DOWNSTREAM
//
// Starts one call through the caller-driven steps, performs its effect
// downstream itself, prints DRIVEN_READY_LINE and waits to be killed: the
// effect happened, the report never came.
package dev.toolledger.test.child

import dev.toolledger.CallerStep
import dev.toolledger.ExecutorConfig
import dev.toolledger.Ledger
import dev.toolledger.LedgerConfig
import dev.toolledger.ToolExecutor
import dev.toolledger.test.Downstream
import dev.toolledger.test.SyncSend
import dev.toolledger.test.emailCall
import java.nio.file.Path
import kotlin.system.exitProcess

/** The line the child prints once the downstream effect is durable. */
const val DRIVEN_READY_LINE = "driven-crash-child: effect committed downstream"

/** The child's main class, for the parent's ProcessBuilder. */
const val DRIVEN_CRASH_CHILD_MAIN = "dev.toolledger.test.child.DrivenCrashChildKt"

fun main(args: Array<String>) {
    require(args.size == 2) { "usage: DrivenCrashChildKt LEDGER_DB DOWNSTREAM" }
    val downstream = Downstream(Path.of(args[1]))
    val executor = ToolExecutor(Ledger.open(args[0], LedgerConfig()), ExecutorConfig())
    executor.register(SyncSend(downstream))
    val step = executor.start("op_crash", 0u, emailCall())
    if (step !is CallerStep.Perform) {
        System.err.println("driven-crash-child: expected Perform, got $step")
        exitProcess(2)
    }
    downstream.perform(step.attempt.request.downstreamKey)
    println(DRIVEN_READY_LINE)
    System.out.flush()
    Thread.sleep(120_000)
    exitProcess(3)
}
