"""Fixtures: a fresh ledger file, a fake downstream, and a runner for the
async executor API (sets UniFFI's event loop, as an app must)."""

import asyncio

import pytest

from toolledger import ffi as tl  # the generated API as it is
from tools import Downstream


def run(make_coro):
    """Runs `make_coro()` on a new event loop registered with UniFFI, so the
    library's threads can schedule the tools' async methods on it."""

    async def main():
        tl.uniffi_set_event_loop(asyncio.get_running_loop())
        try:
            return await make_coro()
        finally:
            tl.uniffi_set_event_loop(None)

    return asyncio.run(main())


@pytest.fixture
def ledger_path(tmp_path):
    return str(tmp_path / "ledger.db")


@pytest.fixture
def ledger(ledger_path):
    return tl.Ledger.open(ledger_path, tl.LedgerConfig())


@pytest.fixture
def downstream(tmp_path):
    return Downstream(tmp_path / "downstream.db")


@pytest.fixture
def fast_config():
    """Short backoff so retries do not slow the suite."""
    return tl.ExecutorConfig(backoff_base_ms=1, backoff_max_ms=5)
