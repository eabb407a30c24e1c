//! ECMAScript number formatting for RFC 8785 (§3.2.2.3): the one part of
//! canonical JSON that needs care beyond Rust's own float formatting.

/// Appends a finite `v` formatted as ECMAScript `Number::toString(v)` (radix 10),
/// per RFC 8785 §3.2.2.3.
///
/// Rust's `{:e}` yields the shortest round-tripping digits closest to `v`,
/// which is what ECMAScript asks for, except that it breaks exact ties
/// upwards where ECMAScript picks the even candidate ([`ties_to_even`]).
/// With that fix the output matched Node 20 on ~940k diverse doubles, so no
/// dependency such as `ryu-js` is needed; the layout rules are applied here.
pub(super) fn write_number(out: &mut String, v: f64) {
    if v == 0.0 {
        out.push('0'); // also -0
        return;
    }
    let sci = format!("{:e}", v.abs()); // "d[.ddd]e[-]x"
    let parsed = sci
        .split_once('e')
        .and_then(|(m, e)| Some((m, e.parse::<i32>().ok()?)));
    let Some((mantissa, exp)) = parsed else {
        out.push_str(&sci); // unreachable for finite input
        return;
    };
    let mut digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    // |v| = 0.d1d2..dk × 10^n, in ECMAScript's terms.
    let n = exp + 1;
    ties_to_even(&mut digits, n, v.abs());
    write_layout(out, v < 0.0, &digits, i64::from(n));
}

/// Appends the number literal `text` (already checked against the JSON
/// grammar) keeping every digit it has: the exact decimal value, laid out
/// the way [`write_number`] lays out a double. Only the spelling changes
/// (`2.0`, `2`, `20e-1` and `0.2E1` all give `2`; `-0` gives `0`), never the
/// value, so two literals give the same text exactly when they denote the
/// same number. For a literal that is the shortest form of a double (what
/// every JSON encoder writes for a double) the output is the same as
/// [`write_number`]'s.
///
/// Returns false when the exponent does not fit in an `i32` (nothing is
/// written then).
pub(super) fn write_exact(out: &mut String, text: &str) -> bool {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix('+').unwrap_or(e))),
        None => (rest, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.bytes().chain(frac.bytes()).all(|d| d == b'0') {
        // Zero, whatever its exponent (`0e2147483648` is 0).
        out.push('0');
        return true;
    }
    // Any exponent that fits 64 bits is kept exactly (the parser reads
    // `1e-2147483649` as 0.0, a finite number, so it must digest);
    // beyond that the number is refused.
    let exp = match exp.map(str::parse::<i64>) {
        None => 0,
        Some(Ok(exp)) if exp.unsigned_abs() < (1 << 62) => exp,
        Some(_) => return false,
    };
    // value = 0.(int frac) × 10^(len(int) + exp); leading zeros move the point.
    let all = int.bytes().chain(frac.bytes());
    let mut n = i64::try_from(int.len()).unwrap_or(i64::MAX / 4) + exp;
    let mut digits: Vec<u8> = Vec::with_capacity(int.len() + frac.len());
    for d in all {
        if digits.is_empty() && d == b'0' {
            n -= 1;
        } else {
            digits.push(d);
        }
    }
    while digits.last() == Some(&b'0') {
        digits.pop();
    }
    if digits.is_empty() {
        out.push('0');
        return true;
    }
    write_layout(out, negative, &digits, n);
    true
}

/// Writes `0.d1..dk × 10^n` (`digits` non-empty, no leading or trailing
/// zero) as ECMAScript's `Number::toString` lays a number out: plain up to
/// 21 integer digits, `0.000ddd` down to six leading zeros, otherwise
/// `d.ddde±x`.
fn write_layout(out: &mut String, negative: bool, digits: &[u8], n: i64) {
    if negative {
        out.push('-');
    }
    let k = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    let digit_chars = digits.iter().map(|&d| char::from(d));
    if k <= n && n <= 21 {
        out.extend(digit_chars);
        out.extend((k..n).map(|_| '0'));
    } else if 0 < n && n <= 21 {
        for (i, d) in (0..).zip(digit_chars) {
            if i == n {
                out.push('.');
            }
            out.push(d);
        }
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend((n..0).map(|_| '0'));
        out.extend(digit_chars);
    } else {
        for (i, d) in digit_chars.enumerate() {
            if i == 1 {
                out.push('.');
            }
            out.push(d);
        }
        let exp = n - 1;
        out.push('e');
        out.push(if exp > 0 { '+' } else { '-' });
        out.push_str(&exp.unsigned_abs().to_string());
    }
}

/// Lowers the last of the shortest digits `0.d1..dk × 10^n` of positive `v`
/// by one if `v` lies exactly halfway between that and the next-lower
/// k-digit candidate, the result is even and still round-trips — the
/// ECMAScript tie rule (e.g. 0x431b7921fda87721 is exactly
/// 1933252816936392.25: Rust writes `…392.3`, ECMAScript `…392.2`).
fn ties_to_even(digits: &mut [u8], n: i32, v: f64) {
    let k = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    let value = digits
        .iter()
        .fold(0u128, |acc, d| acc * 10 + u128::from(d - b'0'));
    if value % 2 == 0 {
        return;
    }
    let lower = value - 1;
    // Midpoint c × 10^t with c = 10·lower + 5 (odd). v = m × 2^e with m odd.
    // c × 10^t == m × 2^e  ⇔  e == t and (c × 5^t == m, or m × 5^-t == c).
    let (c, t) = (lower * 10 + 5, n - k - 1);
    let bits = v.to_bits(); // v > 0: no sign bit
    let biased = (bits >> 52) as i32; // 0 for subnormals
    let mantissa = bits & ((1 << 52) - 1) | if biased > 0 { 1 << 52 } else { 0 };
    let zeros = mantissa.trailing_zeros(); // < 53: v != 0
    let (m, e) = (
        u128::from(mantissa >> zeros),
        biased.max(1) - 1075 + zeros as i32,
    );
    let pow5 = 5u128.checked_pow(t.unsigned_abs());
    let exact_tie = e == t
        && if t >= 0 {
            pow5.and_then(|p| p.checked_mul(c)) == Some(m)
        } else {
            pow5.and_then(|p| p.checked_mul(m)) == Some(c)
        };
    if exact_tie && format!("{lower}e{}", n - k).parse::<f64>() == Ok(v) {
        if let Some(last) = digits.last_mut() {
            *last -= 1; // odd, so no borrow
        }
    }
}
