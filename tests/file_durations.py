"""How long each test file took in a whole run of the suite, from pytest's JUnit XML report: the seconds
`tests/conftest.py` orders the files by when the suite runs on several workers (the longest first), kept in
`tests/file_durations.json`. Measured again after the suite changes much:

    pytest -q -n 0 --junitxml=run.xml && python tests/file_durations.py run.xml > tests/file_durations.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from xml.etree import ElementTree


def file_seconds(junit_xml: str) -> dict[str, float]:
    """Each test file's seconds (its tests' setup, call and teardown), the longest first."""
    seconds: Counter[str] = Counter()
    for case in ElementTree.parse(junit_xml).iter("testcase"):
        module = case.get("classname", "").split(".")
        file = next((part for part in module if part.startswith("test_")), None)
        if file:
            seconds[f"{file}.py"] += float(case.get("time", 0))
    return {file: round(s, 1) for file, s in seconds.most_common()}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/file_durations.py RUN.xml > tests/file_durations.json")
    json.dump(file_seconds(sys.argv[1]), sys.stdout, indent=0)
    sys.stdout.write("\n")
