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
        link = Path(shim) / ("uniffi-bindgen" + (".exe" if os.name == "nt" else ""))
        try:
            link.symlink_to(generator)
        except OSError:
            import shutil

            shutil.copy2(generator, link)
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
