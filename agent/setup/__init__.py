"""Building the runs of a command: `setup.py` (`ready`: the model side, the tool servers, the trajectory
writer), the checks that cost nothing (`setup_checks.py`) and the model's side (`model_setup.py`)."""
