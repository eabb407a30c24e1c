"""The adapter tests (a package, so its modules cannot shadow the suite's own
``conftest`` and ``tools``)."""
