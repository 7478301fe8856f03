"""After everything else in `make test` (it runs this last, alone): no secret any test made is in any log the
run wrote (tests/run_secrets.py says what is remembered and which logs are searched)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests import run_secrets

pytestmark = pytest.mark.after_run

# What a full run makes of each: if one is missing, the remembering broke and the search would prove nothing.
EXPECTED = ["API token", "share link", "holder secret", "login session", "password", "OIDC code",
            "OIDC access token", "OIDC client secret", "metrics token"]  # fmt: skip


def test_no_secret_the_run_made_is_in_any_log_it_wrote():
    secrets = run_secrets.remembered()
    kinds = Counter(kind for digests in secrets.values() for kind in digests.values())
    missing = [kind for kind in EXPECTED if not kinds[kind]]
    assert not missing, f"the run remembered no {missing} (remembered: {dict(kinds)}); run the whole suite first"
    logs = sorted(run_secrets.LOGS.glob("*.log"))
    servers = [path for path in logs if not path.name.startswith("pytest-")]
    texts = {path.name: path.read_bytes() for path in logs}
    # The search covers what it claims: daphne's access logs, the workers', and the test processes' own.
    assert any(b"WSCONNECTING /ws/shares/" in texts[path.name] for path in servers), "no daphne access log"
    assert any(b" ready (" in texts[path.name] for path in servers), "no worker log"
    assert any(name.startswith("pytest-") and text for name, text in texts.items()), "no test process log"
    found = Counter()
    for name, text in texts.items():
        for kind, line in run_secrets.search(text, secrets):
            found[f"{kind} in {name} line {line}"] += 1
    print(f"searched {len(texts)} logs ({sum(map(len, texts.values())):,} bytes) for {sum(kinds.values())} "
          f"secrets: {dict(kinds)}")  # fmt: skip
    assert not found, f"secrets in the logs: {sorted(found)}"
