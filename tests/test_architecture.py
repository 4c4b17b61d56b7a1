"""The import rules between the folders (`[tool.importlinter]` in pyproject.toml), checked by import-linter
itself: the project keeps them, and a rule broken in a small package of the same shape is named, import by
import, so a violation in CI says which line to change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
LINT = str(Path(sys.executable).parent / "lint-imports")


def lint(config: Path, cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    env = None if pythonpath is None else {"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath}
    return subprocess.run(
        [LINT, "--no-logo", "--no-cache", str(config)], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_the_project_keeps_its_import_rules() -> None:
    done = lint(ROOT / "pyproject.toml", ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout and "tools/ is plain Python" in done.stdout


def test_a_forbidden_import_and_a_circle_are_named_where_they_are(tmp_path: Path) -> None:
    package = tmp_path / "shop"
    package.mkdir()
    files = {
        "__init__.py": "",
        "tools.py": "import shop.agent\n",  # tools/ must not import the runtime
        "agent.py": "",
        "orders.py": "from shop import stock\n",
        "stock.py": "def level():\n    from shop import orders\n",  # a circle, through an import in a function
    }
    for name, text in files.items():
        (package / name).write_text(text)
    config = tmp_path / "rules.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["shop"]\n\n'
        '[[tool.importlinter.contracts]]\nname = "tools stay plain"\ntype = "forbidden"\n'
        'source_modules = ["shop.tools"]\nforbidden_modules = ["shop.agent"]\n\n'
        '[[tool.importlinter.contracts]]\nname = "no circles"\ntype = "acyclic_siblings"\n'
        'ancestors = ["shop"]\n'
    )
    done = lint(config, tmp_path, pythonpath=str(tmp_path))
    assert done.returncode == 1
    assert "tools stay plain BROKEN" in done.stdout and "shop.tools -> shop.agent (l.1)" in done.stdout
    assert "no circles BROKEN" in done.stdout and "- .stock -> .orders (1 import)" in done.stdout


def test_every_room_of_the_runtime_is_kept_out_of_the_rooms_below_it() -> None:
    """agent/backends/ and agent/reference/ are rooms that import nothing of the runtime around them; their
    contracts name each room and top module of agent/ they must not import, so a new one must be named there
    too. The one leaf the backends may use: where the user's folders are (their cache of de-quantized weights);
    the command line is kept out of every room by a contract of its own."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    modules = {p.stem for p in (ROOT / "agent").glob("*.py")} | {
        p.parent.name for p in (ROOT / "agent").glob("*/__init__.py")
    }
    runtime = {f"nanbeige.agent.{name}" for name in modules - {"__init__", "cli"}}
    for room, neighbours in (
        ("nanbeige.agent.backends", runtime - {"nanbeige.agent.user_dirs", "nanbeige.agent.backends"}),
        ("nanbeige.agent.reference", runtime - {"nanbeige.agent.reference"}),
    ):
        [contract] = [c for c in contracts if c.get("source_modules") == [room]]
        assert neighbours <= set(contract["forbidden_modules"]), sorted(neighbours - set(contract["forbidden_modules"]))


def test_the_top_of_agent_is_its_rooms_and_a_handful_of_modules() -> None:
    """The runtime is read room by room: what one run does, building runs, the tool side, the trajectory, the
    model clients, the reference's texts and the command line; only the API, the cluster driver and the user's
    folders stay at the top."""
    top = {p.stem for p in (ROOT / "agent").glob("*.py")} - {"__init__"}
    rooms = {p.parent.name for p in (ROOT / "agent").glob("*/__init__.py")}
    assert top == {"api", "cluster", "user_dirs"}, sorted(top)
    assert rooms == {"backends", "cli", "reference", "run", "setup", "toolbox", "trajectory"}, sorted(rooms)
