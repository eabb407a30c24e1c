// The ktx layer's Flow of ledger events: every collector hears each
// committed move (a begin, a commit, an unknown outcome with its reason's
// kind), the events carry no values, a logging observer keeps hearing, and
// an encrypted ledger opens through SuspendLedger with its key.
package dev.toolledger.test

import dev.toolledger.Begin
import dev.toolledger.CallSpec
import dev.toolledger.ExecutionStatus
import dev.toolledger.LedgerEvent
import dev.toolledger.LedgerException
import dev.toolledger.LedgerObserver
import dev.toolledger.ReasonKind
import dev.toolledger.StorageKind
import dev.toolledger.generateLedgerKey
import dev.toolledger.ktx.SuspendLedger
import dev.toolledger.ktx.events
import dev.toolledger.ktx.ledgerConfig
import java.util.Collections
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.coroutineScope
import kotlinx.coroutines.flow.take
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.launch
import kotlin.test.assertEquals
import kotlin.test.assertFailsWith
import kotlin.test.assertFalse
import kotlin.test.assertIs
import kotlin.test.assertTrue

val eventsTests = listOf(
    test("events: each Flow collector hears the begin, the commit and an unknown outcome, without values") {
        val ledger = closeAfter(SuspendLedger.open(ledgerPath))
        val logged = Collections.synchronizedList(mutableListOf<LedgerEvent>())
        ledger.ledger.setObserver(object : LedgerObserver {
            override fun onEvent(event: LedgerEvent) { logged.add(event) }
        })
        val first = Collections.synchronizedList(mutableListOf<LedgerEvent>())
        val second = Collections.synchronizedList(mutableListOf<LedgerEvent>())
        coroutineScope {
            // Unconfined: collecting starts (and the observer is added)
            // before launch returns, so no move is missed.
            launch(Dispatchers.Unconfined) { ledger.events().take(4).toList(first) }
            launch(Dispatchers.Unconfined) { ledger.ledger.events().take(4).toList(second) }
            val spec = CallSpec(call = canaryCall("c1", "pay"), toolVersion = 1u)
            val begun = assertIs<Begin.Execute>(ledger.begin("op", 0, spec))
            ledger.commit(begun.ticket, """{"r":"$CANARY"}""", "ext-$CANARY")
            val other = assertIs<Begin.Execute>(
                ledger.begin("op", 0, CallSpec(call = canaryCall("c2", "pay"), toolVersion = 1u)))
            ledger.markOutcomeUnknown(other.ticket, "timed out waiting for the downstream")
        } // both collectors took their four events and stopped
        val expected = listOf(
            null to ExecutionStatus.EXECUTING,
            ExecutionStatus.EXECUTING to ExecutionStatus.COMMITTED,
            null to ExecutionStatus.EXECUTING,
            ExecutionStatus.EXECUTING to ExecutionStatus.OUTCOME_UNKNOWN,
        )
        for (heard in listOf(first, second, logged)) {
            assertEquals(expected, heard.map { it.fromStatus to it.toStatus })
        }
        assertEquals(ReasonKind.TIMEOUT, first[3].reasonKind)
        assertEquals("pay", first[1].toolName)
        assertEquals(1u, first[1].attempt)
        assertNoCanary(first.map { it.toString() } + first.map { it.line })

        // After the collectors stopped, the log observer still hears.
        val spec = CallSpec(call = canaryCall("c3", "pay"), toolVersion = 1u)
        ledger.commit(assertIs<Begin.Execute>(ledger.begin("op", 0, spec)).ticket, "{}", null)
        assertEquals(6, logged.size)
        assertEquals(4, first.size)
    },

    test("events: a SuspendLedger opened with a key is encrypted; a wrong key is refused") {
        val key = generateLedgerKey()
        val ledger = SuspendLedger.open(ledgerPath, ledgerConfig(), key = key)
        assertTrue(ledger.isEncrypted)
        val spec = CallSpec(call = canaryCall("c1", "pay"), toolVersion = 1u)
        ledger.commit(assertIs<Begin.Execute>(ledger.begin("op", 0, spec)).ticket, """{"r":"$CANARY"}""", null)
        assertFalse(disk(ledgerPath).holds(CANARY))
        ledger.close()
        val wrong = assertFailsWith<LedgerException.Storage> {
            SuspendLedger.open(ledgerPath, ledgerConfig(), key = generateLedgerKey())
        }
        assertEquals(StorageKind.WRONG_KEY, wrong.kind)
        val again = closeAfter(SuspendLedger.open(ledgerPath, ledgerConfig(), key = key))
        assertIs<Begin.Replay>(again.begin("op", 0, spec))
    },
)
