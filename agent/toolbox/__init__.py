"""The tool side of the runtime: the MCP servers a run calls (`toolbox.py`), their environment and logs
(`server_env.py`, `server_log.py`), restarts (`restarts.py`, `lifeline.py`), tool results as the model reads them
(`tool_results.py`) and the cache of them (`cache.py`, `cache_schema.py`)."""
