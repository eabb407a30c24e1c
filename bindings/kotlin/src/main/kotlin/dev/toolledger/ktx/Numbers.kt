// Signed numbers at the public surface: the library counts rounds, attempts,
// versions and milliseconds in unsigned types, which Java callers cannot use
// and Kotlin callers must write as `0u`/`300uL`. Here they are Int and Long;
// a negative value is refused with LedgerException.InvalidInput (the same
// error the library gives for any bad input) before anything is called.
package dev.toolledger.ktx

import dev.toolledger.LedgerException

internal fun Int.toU(what: String): UInt {
    if (this < 0) throw LedgerException.InvalidInput("$what must not be negative (got $this)")
    return toUInt()
}

internal fun Long.toU(what: String): ULong {
    if (this < 0) throw LedgerException.InvalidInput("$what must not be negative (got $this)")
    return toULong()
}

/** An unsigned count from the library as an Int (saturating at Int.MAX_VALUE). */
internal fun UInt.toSigned(): Int = if (this > Int.MAX_VALUE.toUInt()) Int.MAX_VALUE else toInt()

/** Unsigned milliseconds from the library as a Long (saturating at Long.MAX_VALUE). */
internal fun ULong.toSigned(): Long = if (this > Long.MAX_VALUE.toULong()) Long.MAX_VALUE else toLong()
