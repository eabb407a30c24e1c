"""The generated UniFFI API the adapters build on (``toolledger``'s own
names: ``Ledger``, ``ToolExecutor``, ``ToolHandler``, …)."""

import toolledger as tl  # noqa: F401

__all__ = ["tl"]
