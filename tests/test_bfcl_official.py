"""How the official BFCL package is taken in: its own registry entry for the Nanbeige handler, and the loads its
runner's summary table makes, kept for the process without changing a number."""

from __future__ import annotations

import inspect
import re
import sys

from test_eval_bfcl import COUNTS

from nanbeige.evals import bfcl


def test_the_handler_and_its_settings_are_the_packages_own_registry_entry() -> None:
    entry = bfcl.official().entry
    assert entry["model_handler"].__name__ == "NanbeigeFCHandler"
    assert entry["model_handler"].__module__ == "bfcl_eval.model_handler.local_inference.nanbeige_fc"
    assert entry["is_fc_model"] is True and entry["underscore_to_dot"] is False
    assert entry["display_name"] == "Nanbeige4-3B-Thinking-2511 (FC)"


def test_the_summary_table_counts_each_category_it_did_not_grade_from_one_load_per_process() -> None:
    """The runner's summary table loads every category it did not grade, whole, to count its items. The
    package's helper uses those loads for nothing else, so keeping them for the process changes no number."""
    package = bfcl.official()
    helper = sys.modules["bfcl_eval.eval_checker.eval_runner_helper"]
    source = inspect.getsource(helper)
    assert source.count("load_dataset_entry(") == 1 and re.search(r"len\(\s*load_dataset_entry\(", source)
    category = "multi_turn_base"
    whole = package.utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    hits = helper.load_dataset_entry.cache_info().hits
    for _ in range(2):
        assert helper.get_category_score({}, category)["total_count"] == len(whole) == COUNTS[category]
    assert helper.load_dataset_entry.cache_info().hits > hits
