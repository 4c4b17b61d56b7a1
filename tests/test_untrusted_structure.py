"""No code of the project unpickles: every file it reads may come from a folder someone handed over (a
checkpoint, a loop folder, a dataset), and unpickling one runs whatever functions it names. The source is read
with `ast`, so that a new module inherits the rule: `torch.load` only with `weights_only=True`, no `pickle` or
`marshal` load, no `dill`, `cloudpickle`, `joblib` or `shelve`, no `numpy.load` with `allow_pickle`.

Ray unpickles what its nodes send; a node is trusted with the driver's account (docs/scaling.md), and only
`agent/cluster.py` may import it. `pickletools` (read LiveCodeBench's packed tests opcode by opcode, never
unpickled) is no unpickler and needs no exception."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ("agent", "tools", "servers", "trainer", "evals")

UNPICKLERS = {
    "pickle.load",
    "pickle.loads",
    "pickle.Unpickler",
    "_pickle.load",
    "_pickle.loads",
    "_pickle.Unpickler",
    "marshal.load",
    "marshal.loads",
    "pandas.read_pickle",
}
"""Functions that turn bytes into objects by running what the bytes name."""
UNPICKLING_MODULES = {"dill", "cloudpickle", "joblib", "shelve"}
"""Modules whose loading is unpickling: importing one at all is refused."""
TORCH_LOADS = {"torch.load", "torch.serialization.load"}
ALLOWED_IMPORTS = {"ray": {"agent/cluster.py"}}
"""A module that unpickles by design, and the one file that may import it."""


def imported_names(tree: ast.AST) -> dict[str, str]:
    """Each name a module binds by import (at any depth: imports are often lazy) and what it stands for."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def dotted(node: ast.expr, names: dict[str, str]) -> str | None:
    """`torch.serialization.load` for a call's function, its first name resolved through the imports."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([names.get(node.id, node.id), *reversed(parts)])


def keyword_is(call: ast.Call, name: str, value: object) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is value for k in call.keywords)


def import_problems(node: ast.Import | ast.ImportFrom, where: str) -> list[str]:
    modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    found = []
    for module in modules:
        top = module.split(".")[0]
        if top in UNPICKLING_MODULES:
            found.append(f"{where}:{node.lineno}: imports {module}, which unpickles")
        if top in ALLOWED_IMPORTS and where not in ALLOWED_IMPORTS[top]:
            found.append(f"{where}:{node.lineno}: imports {module} (only {sorted(ALLOWED_IMPORTS[top])} may)")
    if isinstance(node, ast.ImportFrom) and node.module in ("pickle", "_pickle", "marshal"):
        for alias in node.names:
            if alias.name == "*" or f"{node.module}.{alias.name}" in UNPICKLERS:
                found.append(f"{where}:{node.lineno}: imports {node.module}.{alias.name}, which unpickles")
    return found


def call_problem(call: ast.Call, names: dict[str, str], where: str) -> str | None:
    function = dotted(call.func, names)
    if function in TORCH_LOADS and not keyword_is(call, "weights_only", True):
        return f"{where}:{call.lineno}: {function} without weights_only=True unpickles"
    if function in UNPICKLERS:
        return f"{where}:{call.lineno}: {function} unpickles"
    allow_pickle = any(k.arg == "allow_pickle" for k in call.keywords) and not keyword_is(call, "allow_pickle", False)
    if function == "numpy.load" and allow_pickle:
        return f"{where}:{call.lineno}: numpy.load with allow_pickle unpickles"
    return None


def unpickling_in(path: Path, where: str) -> list[str]:
    """Every place in one source file that unpickles (or may), as `file:line: what`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = imported_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend(import_problems(node, where))
        elif isinstance(node, ast.Call):
            problem = call_problem(node, names, where)
            if problem:
                found.append(problem)
    return found


def test_no_code_of_the_project_unpickles() -> None:
    files = [path for folder in SOURCE for path in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 50  # the source was found
    found = [problem for path in files for problem in unpickling_in(path, path.relative_to(ROOT).as_posix())]
    assert found == []


UNPICKLING = {
    "torch.load(p, weights_only=False)": "import torch\n\ntorch.load(p, weights_only=False)\n",
    "torch.load without weights_only": "def f(p):\n    import torch as t\n\n    return t.load(p)\n",
    "torch.load imported by name": "from torch import load\n\nload(p, weights_only=None)\n",
    "torch.serialization.load": "import torch\n\ntorch.serialization.load(p)\n",
    "pickle.loads": "import pickle\n\npickle.loads(b)\n",
    "pickle.load imported by name": "from pickle import load\n",
    "pickle.Unpickler": "import pickle as p\n\np.Unpickler(f).load()\n",
    "dill": "import dill\n",
    "cloudpickle": "from cloudpickle import loads\n",
    "joblib": "import joblib\n\njoblib.load(p)\n",
    "numpy.load with allow_pickle": "import numpy as np\n\nnp.load(p, allow_pickle=True)\n",
    "Ray outside agent/cluster.py": "import ray\n",
}


def test_the_scan_names_each_way_to_unpickle(tmp_path: Path) -> None:
    for case, source in UNPICKLING.items():
        path = tmp_path / "module.py"
        path.write_text(source)
        found = unpickling_in(path, "trainer/module.py")
        assert len(found) >= 1 and all(line.startswith("trainer/module.py:") for line in found), case
    path.write_text(
        "import pickle\nimport pickletools\nimport numpy as np\nimport torch\n\n"
        "torch.load(p, weights_only=True)\nnp.load(p)\nnp.load(p, allow_pickle=False)\n"
        "pickle.dumps(x)\nlist(pickletools.genops(b))\n"
    )
    assert unpickling_in(path, "trainer/module.py") == []  # what does not unpickle is not named
    path.write_text("import ray\n")
    assert unpickling_in(path, "agent/cluster.py") == []
