// The child JVM of the crash-recovery test:
//
//     java -cp <the suite's classpath> dev.toolledger.test.child.CrashChildKt LEDGER_DB DOWNSTREAM
//
// Opens the ledger, registers a tool that performs its effect downstream and
// then hangs, and executes one call. Once the effect is durable downstream it
// prints READY_LINE on stdout; the parent then kills this JVM with SIGKILL:
// the effect happened, the ledger never heard back.
package dev.toolledger.test.child

import dev.toolledger.ExecutorConfig
import dev.toolledger.Ledger
import dev.toolledger.LedgerConfig
import dev.toolledger.ToolExecutor
import dev.toolledger.test.Downstream
import dev.toolledger.test.SendThenHang
import dev.toolledger.test.emailCall
import java.nio.file.Path
import kotlin.system.exitProcess
import kotlinx.coroutines.runBlocking

/** The line the child prints once the downstream effect is durable. */
const val READY_LINE = "crash-child: effect committed downstream"

/** The child's main class, for the parent's ProcessBuilder. */
const val CRASH_CHILD_MAIN = "dev.toolledger.test.child.CrashChildKt"

fun main(args: Array<String>) {
    require(args.size == 2) { "usage: CrashChildKt LEDGER_DB DOWNSTREAM" }
    val ledger = Ledger.open(args[0], LedgerConfig())
    val executor = ToolExecutor(ledger, ExecutorConfig(performTimeoutMs = null))
    executor.register(SendThenHang(Downstream(Path.of(args[1]))) {
        println(READY_LINE)
        System.out.flush()
    })
    runBlocking { executor.execute("op_crash", 0u, emailCall()) }
    System.err.println("crash-child: unreachable, the tool never returns")
    exitProcess(3)
}
