"""One run of the agent: the loop (`loop.py`) and what it keeps and reads while it runs: the run's state
(`run_state.py`), the tool dialects (`dialects.py`), the replies parsed (`replies.py`), the context kept within
the window (`context.py`), token-exact prompts (`tokens.py`), the final turn (`final_turn.py`), a run restored
from its trajectory (`restore.py`), usage and budgets (`usage.py`) and its settings (`run_config.py`)."""
