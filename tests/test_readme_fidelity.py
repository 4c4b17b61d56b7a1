"""The fidelity table (docs/fidelity.md) names, for each row, the tests that hold it true: each must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_every_test_the_fidelity_table_names_exists() -> None:
    page = (ROOT / "docs" / "fidelity.md").read_text()
    # the table, by topic under the section's subheadings: every row of a table headed "reference behaviour"
    table = page.split("## Behaviour by behaviour", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| reference")]
    assert len(rows) >= 20
    defined = set(
        re.findall(
            r"^(?:async )?def (test_\w+)", "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py")), re.M
        )
    )
    named = [name for row in rows for name in re.findall(r"`(test_\w+)`", row.rsplit("|", 2)[-2])]
    assert len(named) >= 20
    missing = [name for name in named if name not in defined]
    assert not missing, missing
    unchecked = [row[:60] for row in rows if not re.search(r"`test_\w+`", row.rsplit("|", 2)[-2])]
    assert unchecked == ["| Deep-search chat template `tokenizer_config_search.json` |"], unchecked
