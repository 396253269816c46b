"""The package's shape: imports run one way (no module of a3c imports, however indirectly,
one that imports it back), and the config layer stands alone (loading a config imports no
environment, torch or queue)."""
import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "a3c"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The a3c modules `path` imports, at any depth of its code (a function's own import
    counts: it is a dependency all the same)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base.split(".")[0] != "a3c":
                continue
            for alias in node.names:  # `from . import vtrace` names a module
                candidate = f"{base}.{alias.name}"
                found.add(candidate if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists()
                          else base)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "a3c"}
    return found - {name}


def test_the_import_graph_of_the_package_has_no_cycle():
    graph = {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}
    # A package's __init__ re-exports its modules: importing a3c.envs.sources runs a3c.envs
    # first, which is no dependency of sources on its siblings.
    graph = {name: {dep for dep in deps if not name.startswith(dep + ".")} for name, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            assert state.get(dep) != 1, "import cycle: " + " -> ".join(path + [name, dep])
            if dep not in state:
                visit(dep, path + [name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_loading_a_config_imports_neither_torch_nor_gymnasium_nor_the_queue():
    code = ("import sys; from a3c.config import load_config; load_config('cartpole', ['optim.lr=3e-4']); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'gymnasium', 'replay', 'numpy'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
