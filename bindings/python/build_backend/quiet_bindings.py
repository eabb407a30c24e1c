#!/usr/bin/env python3
"""quiet_bindings.py — keeps a tool's exception text inside the app.

UniFFI's generated Python code, when an app's tool (an async foreign trait
method) raises an exception that is not the declared error type, prints the
exception and its traceback to stderr and sends repr(exception) to Rust. A
tool's exception text is user data (an address, an amount, a token): it must
not reach stderr, logs or the ledger. This rewrites the generated module so
that such an exception crosses as its type name only and nothing is printed.
The ledger records the call as an unknown outcome either way.

Used by the wheel's build backend (toolledger_build.py, on the module
maturin generates) and by scripts/generate-bindings.sh:
`quiet_bindings.py <generated toolledger.py>`. Fails when the patterns are
missing (a UniFFI upgrade changed the template: look again).
"""

import sys

PRINT = 'print("UniFFI: Unhandled exception in trait interface call", file=sys.stderr)'
TRACE = "traceback.print_exc(file=sys.stderr)"
REPR = ".lower(repr(e))"


def quiet(path):
    """Rewrites the generated module at `path` in place."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for needle in (PRINT, TRACE, REPR):
        if needle not in text:
            sys.exit(f"quiet_bindings: {needle!r} not found in {path}")
    text = text.replace(PRINT, "pass  # toolledger: a tool's exception text is user data")
    text = text.replace(TRACE, "pass")
    text = text.replace(REPR, ".lower(type(e).__name__)")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    quiet(sys.argv[1])
