"""The alerting rule shipped beside the dashboard, checked and unit-tested by Prometheus' own
promtool: it fires for a hook that turned itself off, with the labels that say which."""
from __future__ import annotations

import os
import subprocess

from tests.kit.prometheus import binary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "dashboards", "mmscope-alerts.yml")
RULE_TESTS = os.path.join(ROOT, "tests", "data", "alerts")


def promtool(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def test_the_rules_file_is_valid():
    done = promtool("check", "rules", RULES)
    assert done.returncode == 0 and "SUCCESS: 1 rules found" in done.stdout, done.stdout + done.stderr


def test_the_hook_off_alert_fires_for_the_hook_that_turned_off_only():
    done = promtool("test", "rules", "mmscope-alerts.test.yml", cwd=RULE_TESTS)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
