"""The one data type and its files: `Trajectory` with its turns (`trajectory.py`), its JSONL file
(`trajectory_file.py`, `records.py`), a cluster shard's results (`shard_results.py`) and whether a place can be
written (`writable.py`)."""
