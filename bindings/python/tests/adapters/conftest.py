"""A summary of the effects counted by the crash-resume tests."""


def pytest_terminal_summary(terminalreporter):
    from .test_crash_resume import RESULTS

    if not RESULTS:
        return
    terminalreporter.section("effects at the downstream after a crash and a resume")
    for framework, mode, downstream, effects in sorted(RESULTS):
        terminalreporter.write_line(f"{framework:14} {mode:10} downstream={downstream:8} effects={effects}")
