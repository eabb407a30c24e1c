// Entry point of the Kotlin binding suite (scripts/test-kotlin.sh):
//
//     java -cp <tests.jar + toolledger.jar (libtoolledger.so inside) + runtime> \
//          dev.toolledger.test.MainKt [name-filter ...]
//
// Arguments select tests whose name contains any of them.
package dev.toolledger.test

fun main(args: Array<String>) {
    runTests(scenarioTests + ownershipTests + concurrencyTests + crashRecoveryTests + layerTests + callerDrivenTests + privacyTests + eventsTests + fastCallsTests + suspendCallTests + closedExecutorTests + loneSurrogateTests + interruptionTests + callerToolTests + callerToolScheduleTests + roundTests + textSizesTests, args.toList())
}
