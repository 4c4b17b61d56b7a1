"""The command line: the `nanbeige` program (`program.py`: the app, `ask`, `resume`, `show`) and its commands,
the only code that uses the runtime (`nanbeige.agent`), evals and the trainer together. The entry point is
`entry.main`, which sets the process up before anything heavy is imported."""
