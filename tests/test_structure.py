"""The package's shape, read from its source with `ast` (no import, no TensorFlow, no subprocess): no import
cycle between runner modules, whether the import is at module level or inside a function.

A function-level import hides a cycle from Python until the function runs; two modules that import each other
cannot be read, tested or moved one at a time, so any cycle fails here.
"""

import ast
import pathlib

RUNNER = pathlib.Path(__file__).resolve().parent.parent / "runner"


def _modules(root: pathlib.Path = RUNNER) -> dict:
    """{dotted module name: path} for every .py file under runner/ (a package is its __init__.py)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: pathlib.Path, modules: dict) -> set:
    """The runner modules that module `name` imports anywhere in its body (module level, functions, classes)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..y import z
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:  # `from pkg import mod` imports the module pkg.mod; else a name of pkg
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {t for t in targets if t in modules and t != name}


def import_graph(root: pathlib.Path = RUNNER) -> dict:
    modules = _modules(root)
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: dict) -> list:
    """One cycle (as a path a -> ... -> a) per strongly connected group of modules that import each other."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):  # Tarjan's algorithm; the package is small enough for recursion
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(group, graph) for group in groups]


def _cycle_in(group: set, graph: dict) -> list:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for nxt in sorted(graph[path[-1]] & group):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                paths.append(path + [nxt])
    return sorted(group)


def test_no_import_cycle_between_runner_modules():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles in runner/:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_function_level_and_relative_imports(tmp_path):
    package = tmp_path / "runner"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from runner import b\n")
    (package / "b.py").write_text("def f():\n    from runner.sub.c import g\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("class K:\n    def m(self):\n        from .. import a\n")
    (package / "d.py").write_text("import runner.a\n")
    graph = import_graph(package)
    assert graph["runner.b"] == {"runner.sub.c"} and graph["runner.sub.c"] == {"runner.a"}
    assert find_cycles(graph) == [["runner.a", "runner.b", "runner.sub.c", "runner.a"]]
    (package / "sub" / "c.py").write_text("def g():\n    pass\n")
    assert find_cycles(import_graph(package)) == []


def test_an_unknown_executor_is_a_config_error_that_names_the_valid_ones():
    import pytest

    from runner.errors import ConfigError
    from runner.executors import EXECUTORS, get_executor

    assert EXECUTORS == ("fit", "custom_loop") and all(callable(get_executor(name)) for name in EXECUTORS)
    with pytest.raises(ConfigError, match=r"executor.name='custom' is not an executor; valid executors: fit, custom_loop"):
        get_executor("custom")
