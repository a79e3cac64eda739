"""The package's shape, read from its source with `ast` (no import, no TensorFlow, no subprocess): no import
cycle between runner modules, whether the import is at module level or inside a function.

A function-level import hides a cycle from Python until the function runs; two modules that import each other
cannot be read, tested or moved one at a time, so any cycle fails here.
"""

import ast
import pathlib

RUNNER = pathlib.Path(__file__).resolve().parents[2] / "runner"


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
    from omegaconf import OmegaConf

    from runner.builders.executor import build_executor
    from runner.config import registry
    from runner.errors import ConfigError

    assert list(registry.options("executor")) == ["fit", "custom_loop"]
    assert all(callable(build_executor(OmegaConf.create({"name": name}))) for name in ("fit", "custom_loop"))
    with pytest.raises(ConfigError, match=r"executor=custom is unknown; choose one of: fit, custom_loop\."):
        build_executor(OmegaConf.create({"name": "custom"}))


# --- layering: the rules each package's __init__.py states ------------------------------------------------------------

TENSORFLOW = {"tensorflow", "tf_keras", "keras", "tensorflow_datasets"}
PACKAGES = sorted(p.parent.name for p in RUNNER.glob("*/__init__.py"))


def rules(package: str, root: pathlib.Path = RUNNER) -> dict:
    """The `Imports:`, `TensorFlow:` and `mlflow:` lines of runner/<package>/__init__.py's docstring (a line may go on
    over the next lines until the next key)."""
    doc = ast.get_docstring(ast.parse((root / package / "__init__.py").read_text())) or ""
    found, key = {}, None
    for line in doc.splitlines():
        head = line.split(":", 1)[0]
        if head in ("Imports", "TensorFlow", "mlflow"):
            key, found[head] = head, line.split(":", 1)[1].strip()
        elif key and line.strip():
            found[key] += " " + line.strip()
        else:
            key = None
    return found


def _external(path: pathlib.Path) -> list:
    """(top-level name, at module level?) for every import of a module outside runner."""
    tree = ast.parse(path.read_text(), str(path))
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        found += [(n.split(".")[0], id(node) not in in_function) for n in names]
    return found


def _allowed(rule: str, top: str, module_level: bool, module: str) -> bool:
    if rule.startswith("never"):
        return False
    if rule.startswith("in functions"):  # "in functions; at module level in runner.x.y (why)" names the exceptions
        exceptions = rule.split("at module level in", 1)[1].split("(")[0] if "at module level in" in rule else ""
        return not module_level or module in exceptions.replace(",", " ").split()
    if rule.startswith("only in"):
        return module in rule.split("(")[0].replace(",", " ").split()
    return rule.startswith("yes")


def layering_problems(root: pathlib.Path = RUNNER) -> list:
    graph, modules, problems = import_graph(root), _modules(root), []
    for package in sorted(p.parent.name for p in root.glob("*/__init__.py")):
        stated = rules(package, root)
        missing = {"Imports", "TensorFlow", "mlflow"} - set(stated)
        if missing:
            problems.append(f"runner/{package}/__init__.py states no {', '.join(sorted(missing))}: line")
            continue
        allowed = {f"runner.{package}", *[w.strip(",.;") for w in stated["Imports"].split() if w.startswith("runner.")]}
        for name in sorted(m for m in graph if m.startswith(f"runner.{package}.") or m == f"runner.{package}"):
            for target in sorted(graph[name]):  # `runner` itself: its __init__ holds only STARTED and the version
                if target != "runner" and not any(target == a or target.startswith(a + ".") for a in allowed):
                    problems.append(f"{name} imports {target}, which runner.{package} does not list under Imports:")
            for top, module_level in _external(modules[name]):
                for kind, names in (("TensorFlow", TENSORFLOW), ("mlflow", {"mlflow"})):
                    if top in names and not _allowed(stated[kind], top, module_level, name):
                        where = "at module level" if module_level else "in a function"
                        problems.append(f"{name} imports {top} {where}; runner.{package} says {kind}: {stated[kind]}")
    return problems


def test_every_package_keeps_the_rules_its_init_states():
    problems = layering_problems()
    assert not problems, "\n".join(problems)


def test_the_training_process_never_imports_mlflow():
    """Everything a training task and a launcher import, at module level or in a function, is mlflow-free: the MLflow
    process (started with -m, never imported) does MLflow's work."""
    graph, modules = import_graph(), _modules()
    for start in ("runner.experiment", "runner.launch.localhost", "runner.launch.ray_cluster", "runner.launch.pods"):
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(graph[name])
        offenders = sorted(m for m in seen if any(top == "mlflow" for top, _ in _external(modules[m])))
        assert not offenders, f"{start} reaches modules that import mlflow: {offenders}"


def test_the_layering_check_sees_a_broken_rule(tmp_path):
    package = tmp_path / "runner"
    for sub in ("low", "high"):
        (package / sub).mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text('"""Low.\n\nImports: runner.errors\nTensorFlow: never\nmlflow: never\n"""\n')
    (package / "high" / "__init__.py").write_text(
        '"""High.\n\nImports: runner.low\nTensorFlow: in functions\nmlflow: never\n"""\n'
    )
    (package / "errors.py").write_text("")
    (package / "low" / "a.py").write_text("from runner import errors\n")
    (package / "high" / "b.py").write_text("from runner.low import a\n\ndef f():\n    import tensorflow\n")
    assert layering_problems(package) == []
    (package / "low" / "a.py").write_text("from runner.high import b\nimport tf_keras\n")
    (package / "high" / "b.py").write_text("import tensorflow as tf\n")
    assert layering_problems(package) == [
        "runner.high.b imports tensorflow at module level; runner.high says TensorFlow: in functions",
        "runner.low.a imports runner.high.b, which runner.low does not list under Imports:",
        "runner.low.a imports tf_keras at module level; runner.low says TensorFlow: never",
    ]
