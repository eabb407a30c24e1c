#!/usr/bin/env python3
"""test_fast_calls.py — the post-processing step fails loudly, never silently.

    test_fast_calls.py <unpatched generated toolledger.kt> <patched toolledger.kt>

Run by scripts/test-kotlin.sh on the file it just generated (the unpatched
copy scripts/generate-bindings.sh keeps): the patched file that is compiled
is exactly fast_calls.py applied to the generated one; for every anchor,
a copy of the generated file with that anchor's text altered makes
fast_calls.py exit non-zero and leaves the copy byte-for-byte as it was;
and a second application fails. Prints one line per check; exits 1 on the
first failure.
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fast_calls  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fast_calls.py")


def run_step(text):
    """Runs fast_calls.py on a temp file holding `text`: (exit code, file text after)."""
    with tempfile.NamedTemporaryFile("w", suffix=".kt", delete=False, encoding="utf-8") as f:
        f.write(text)
        path = f.name
    try:
        code = subprocess.run([sys.executable, SCRIPT, path], capture_output=True).returncode
        with open(path, encoding="utf-8") as f:
            return code, f.read()
    finally:
        os.unlink(path)


def fail(message):
    print(f"test_fast_calls: FAIL {message}")
    sys.exit(1)


def main(unpatched_path, patched_path):
    with open(unpatched_path, encoding="utf-8") as f:
        generated = f.read()
    with open(patched_path, encoding="utf-8") as f:
        compiled = f.read()
    if fast_calls.patch(generated) != compiled:
        fail("the compiled file is not fast_calls.py applied to the generated one")
    print("test_fast_calls: ok the compiled file is the generated one, patched")

    anchors = [(what, old) for what, old, _new, _count in fast_calls.REPLACEMENTS]
    anchors += list(fast_calls.REQUIRED)
    for what, needle in anchors:
        # Alter the anchor's first line (a template change would).
        first = needle.splitlines()[0]
        altered = generated.replace(first, first.replace("(", "( ", 1) if "(" in first else first + " ")
        if altered == generated:
            fail(f"could not alter the anchor of {what}")
        code, after = run_step(altered)
        if code == 0:
            fail(f"a changed anchor ({what}) did not fail the step")
        if after != altered:
            fail(f"a failed step ({what}) changed the file")
        print(f"test_fast_calls: ok a changed anchor fails the step: {what}")

    code, after = run_step(compiled)
    if code == 0 or after != compiled:
        fail("patching an already patched file did not fail")
    print("test_fast_calls: ok a second application fails")

    # A count that is off (the template repeated a piece) fails too.
    one = fast_calls.REPLACEMENTS[0][1]
    code, _ = run_step(generated + "\n" + one)
    if code == 0:
        fail("a doubled anchor did not fail the step")
    print("test_fast_calls: ok a doubled anchor fails the step")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: test_fast_calls.py <unpatched toolledger.kt> <patched toolledger.kt>")
    main(sys.argv[1], sys.argv[2])
