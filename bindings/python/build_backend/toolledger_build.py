"""The PEP 517 build backend of the `toolledger` wheel: maturin, with the
workspace's own UniFFI generator on PATH.

maturin generates the Python module of a `bindings = "uniffi"` project with
a binary named `uniffi-bindgen`. A workspace binary of that name would be
run with `cargo run --bin uniffi-bindgen` from the workspace root, where
cargo selects the root package (the core library, which has no such binary
and no `bindgen` feature) and fails. So the FFI crate names its generator
`toolledger-bindgen`, and this backend builds it
(`cargo build -p toolledger-ffi --features bindgen --bin toolledger-bindgen`)
and links it as `uniffi-bindgen` into a temporary directory put first on
PATH for maturin's hooks. The generator is thus always the one built from
the workspace's pinned uniffi, never one found elsewhere.

The `uniffi-bindgen` on PATH is a small wrapper (POSIX): it runs the
generator, then rewrites the generated module with quiet_bindings.py, so a
tool's exception text is never printed to stderr nor sent to the library
(UniFFI's template prints it and its traceback), and with lean_runtime.py,
which replaces the generated marshalling helpers with cheaper equivalents
(each replaced region checked by hash: a changed template fails the build).

Every PEP 517 hook is maturin's own, wrapped.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import maturin

# bindings/python/build_backend/ -> the repository root (the Cargo workspace).
WORKSPACE = Path(__file__).resolve().parents[3]


def _log(message: str) -> None:
    print(f"toolledger-build: {message}", file=sys.stderr, flush=True)


# Runs the generator, then quiets and leans every generated module under --out-dir.
_WRAPPER = """#!{python}
import pathlib, subprocess, sys
status = subprocess.run([{generator!r}, *sys.argv[1:]]).returncode
if status:
    sys.exit(status)
args = sys.argv[1:]
if "generate" in args:
    out = None
    for flag in ("--out-dir", "-o"):
        if flag in args:
            out = args[args.index(flag) + 1]
    if out is None:
        sys.exit("toolledger-build: uniffi-bindgen generate without --out-dir")
    modules = list(pathlib.Path(out).rglob("toolledger.py"))
    if not modules:
        sys.exit("toolledger-build: no generated toolledger.py under " + out)
    sys.path.insert(0, {quiet_dir!r})
    import lean_runtime
    import quiet_bindings
    for module in modules:
        quiet_bindings.quiet(str(module))
        lean_runtime.lean(str(module))
"""


@contextlib.contextmanager
def _generator_on_path() -> Iterator[None]:
    if not (WORKSPACE / "ffi" / "Cargo.toml").is_file():
        raise RuntimeError(
            f"toolledger-build: no ffi/Cargo.toml under {WORKSPACE}: build the wheel from a "
            "checkout of the repository (pip install ./bindings/python)"
        )
    _log("building the UniFFI generator (toolledger-bindgen)")
    subprocess.run(
        ["cargo", "build", "--quiet", "-p", "toolledger-ffi", "--features", "bindgen",
         "--bin", "toolledger-bindgen"],
        cwd=WORKSPACE,
        check=True,
    )
    metadata = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        cwd=WORKSPACE,
        check=True,
        capture_output=True,
        text=True,
    )
    exe = "toolledger-bindgen" + (".exe" if os.name == "nt" else "")
    generator = Path(json.loads(metadata.stdout)["target_directory"]) / "debug" / exe
    if not generator.is_file():
        raise RuntimeError(f"toolledger-build: {generator} was not built")
    old_path = os.environ.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="toolledger-bindgen-") as shim:
        if os.name == "nt":
            raise RuntimeError(
                "toolledger-build: building the wheel on Windows is not supported "
                "(the generated module must be rewritten by quiet_bindings.py)"
            )
        link = Path(shim) / "uniffi-bindgen"
        link.write_text(_WRAPPER.format(
            python=sys.executable,
            generator=str(generator),
            quiet_dir=str(Path(__file__).resolve().parent),
        ))
        link.chmod(0o755)
        os.environ["PATH"] = shim + os.pathsep + old_path
        try:
            yield
        finally:
            os.environ["PATH"] = old_path


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    with _generator_on_path():
        return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    with _generator_on_path():
        return maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory: str, config_settings: Optional[Mapping[str, Any]] = None) -> str:
    return maturin.build_sdist(sdist_directory, config_settings)


get_requires_for_build_wheel = maturin.get_requires_for_build_wheel
get_requires_for_build_editable = getattr(
    maturin, "get_requires_for_build_editable", maturin.get_requires_for_build_wheel
)
get_requires_for_build_sdist = maturin.get_requires_for_build_sdist
prepare_metadata_for_build_wheel = maturin.prepare_metadata_for_build_wheel
if hasattr(maturin, "prepare_metadata_for_build_editable"):
    prepare_metadata_for_build_editable = maturin.prepare_metadata_for_build_editable
