"""The five packages' imports: the contract at the bottom, no upward import, no cycle."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from workloads import catalog

REPO = Path(__file__).resolve().parents[1]
# Bottom to top: a package may import only packages at or below its own layer.
LAYERS = ("contract", "workloads", "worker", "coordinator", "testbed")  # testbed: ops/lab.sh
# The coordinator's own floors, bottom to top, in the order of the data flow: a plan, the store
# of its records, the results made from them, the two transports that run a campaign (neither
# imports the other), the command line.
FLOORS = (
    ("coordinator.plan",),
    ("coordinator.store",),
    ("coordinator.results",),
    ("coordinator.local", "coordinator.fleet"),
    ("coordinator.cli",),
    ("coordinator.__main__",),
)
Graph = dict[str, set[str]]


def module_files(root: Path = REPO) -> dict[str, Path]:
    """Every module of the four packages by dotted name (a package by its own name)."""
    out = {}
    for package in LAYERS:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module an ``from ... import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _imported(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Every dotted name an import statement anywhere in ``tree`` may refer to."""
    names: list[str] = []
    for node in ast.walk(tree):  # function-level and TYPE_CHECKING imports count too
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def import_graph(modules: dict[str, Path]) -> Graph:
    """Module -> the modules of the four packages it imports."""

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = defaultdict(set)
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in _imported(tree, module, path.name == "__init__.py"):
            target = owner(name) if name.split(".")[0] in LAYERS else None
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def upward_imports(graph: Graph) -> list[str]:
    """Imports from a package into one above it (``contract`` importing ``worker``, ...)."""
    layer = {package: i for i, package in enumerate(LAYERS)}
    return [
        f"{a} imports {b}"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if layer[b.split(".")[0]] > layer[a.split(".")[0]]
    ]


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def test_no_package_imports_one_above_it() -> None:
    """contract/ imports nothing of the other three; workloads/ nothing of worker/, coordinator/."""
    graph = import_graph(module_files())
    assert graph, "the import walk found no imports at all"
    assert upward_imports(graph) == []


def floor_of(module: str) -> tuple[int, str] | None:
    """The coordinator floor of ``module`` and the part of it (``None`` outside them)."""
    for i, parts in enumerate(FLOORS):
        for part in parts:
            if module == part or module.startswith(part + "."):
                return i, part
    return None


def floor_violations(graph: Graph) -> list[str]:
    """Coordinator imports up a floor, or across the two transports."""
    out = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            fa, fb = floor_of(a), floor_of(b)
            if fa is None or fb is None:
                continue
            if fb[0] > fa[0] or (fa[0] == fb[0] and fa[1] != fb[1]):
                out.append(f"{a} imports {b}")
    return out


def test_the_coordinator_floors_follow_the_data_flow() -> None:
    """plan < store < results < transports (local, fleet: apart) < cli; nothing imports upward."""
    modules = module_files()
    assert all(floor_of(m) for m in modules if m.startswith("coordinator.")), "off the floors"
    assert floor_violations(import_graph(modules)) == []


def test_the_floor_check_sees_an_upward_import() -> None:
    """A store module importing a result module, and local importing the fleet, are flagged."""
    graph = {
        "coordinator.store.x": {"coordinator.results.y"},
        "coordinator.local": {"coordinator.fleet.z"},
        "coordinator.results.y": {"coordinator.store.x"},
    }
    assert floor_violations(graph) == [
        "coordinator.local imports coordinator.fleet.z",
        "coordinator.store.x imports coordinator.results.y",
    ]


def test_the_four_packages_have_no_import_cycle() -> None:
    """No set of modules imports itself round, however indirectly."""
    assert cycles(import_graph(module_files())) == []


@pytest.mark.parametrize(
    ("files", "upward", "cycle"),
    [
        ({"contract/a.py": "from worker import b\n", "worker/b.py": ""},
         ["contract.a imports worker", "contract.a imports worker.b"], []),
        ({"worker/a.py": "from . import b\n", "worker/b.py": "def f():\n    import worker.a\n"},
         [], [["worker.a", "worker.b"]]),
        ({"coordinator/a.py": "import contract.b\n", "contract/b.py": ""}, [], []),
    ],
)  # fmt: skip
def test_the_walk_sees_upward_imports_and_cycles(
    tmp_path: Path, files: dict[str, str], upward: list[str], cycle: list[list[str]]
) -> None:
    """The checker flags an upward import and a cycle hidden in a function, and only those."""
    for package in LAYERS:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    graph = import_graph(module_files(tmp_path))
    assert upward_imports(graph) == upward
    assert cycles(graph) == cycle


def test_the_payload_needs_only_workloads(tmp_path: Path) -> None:
    """The payload runs inside environments (containers, guests) where only ``workloads/`` is
    present: its modules import the standard library and ``workloads`` alone, and it finds
    every workload and calibration the catalog declares, by searching the families and in the
    family the host names for it (``--family``: ``catalog.FAMILY``); a family that does not
    declare it, or no family, is an error that names it."""
    shutil.copytree(REPO / "workloads", tmp_path / "workloads",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    names = [*catalog.DECLARED, *catalog.CALIBRATION]
    pairs = [f"{n}:{catalog.FAMILY[n]}" for n in names]
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import workloads.protocol as p; "
        "print(' '.join(p.find_declared(n).name for n in sys.argv[2:])); "
        "print(' '.join(p.find_declared(*n.split(':')).name for n in sys.argv[2:] if ':' in n)); "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('workloads', 'contract', 'worker', 'coordinator'))))"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(tmp_path), *names],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found, _, loaded = (line.split() for line in done.stdout.splitlines())
    assert found == names
    probe = probe.replace("for n in sys.argv[2:])", "for n in ())")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(tmp_path), *pairs],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split() == names
    for wrong, said in ((["publish:writes"], "unknown workload 'publish'"),
                        (["publish:nowhere"], "unknown family 'nowhere'")):  # fmt: skip
        done = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(tmp_path), *wrong],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode != 0
        assert said in done.stderr, done.stderr
    assert "workloads.catalog" not in loaded  # the families one at a time, not the catalog
    assert all(m.split(".")[0] == "workloads" for m in loaded), loaded


# Modules the payload must not import for its workload, after Ready and before its first answer:
# each costs about 2 ms in gVisor and tens of ms in a TCG guest (``workloads/kit.py``); ``json``
# and ``pathlib`` (each about 8 ms here, with ``re``) neither (``workloads/jsonline.py``).
HEAVY = ("dataclasses", "inspect", "ast", "typing", "shutil", "workloads.catalog", "json",
         "pathlib")  # fmt: skip
# ``re`` and ``enum`` come only with ``subprocess`` (its ``locale`` and ``signal``), which only
# the workloads that run tools load (their ``preload``); ``collections`` (``collections.abc``)
# with it or ``threading``, never for the type hints alone (``workloads/kit.py``).
NO_TOOLS = ("subprocess", "re", "enum", "collections", "collections.abc")
OTHER_FAMILIES = ("workloads.writes", "workloads.reads", "workloads.working_set")


@pytest.mark.parametrize(
    ("workload", "also_not", "loads"),
    [("sentinel-cpu", ("threading", "workloads.writes", *NO_TOOLS), ()),
     ("seq-write", ("threading", "workloads.reads", *NO_TOOLS), ()),
     ("read-small", ("threading", "workloads.writes", *NO_TOOLS), ()),
     ("ws1024-w1", ("workloads.reads", *NO_TOOLS[:3]), ("threading",)),  # and its collections
     ("publish", ("threading", *OTHER_FAMILIES, *NO_TOOLS), ()),
     ("repo-inspect", OTHER_FAMILIES, ("subprocess",)),
     ("incremental-build", OTHER_FAMILIES, ("subprocess",))],
)  # fmt: skip
def test_the_payload_imports_only_what_its_workload_needs(
    workload: str, also_not: tuple[str, ...], loads: tuple[str, ...], tmp_path: Path
) -> None:
    """Told its family (``--family``, as every mode's command line does), the payload imports
    that family alone, and what the workload's rounds need (``subprocess`` for the tools) before
    it answers ``check 0``, never inside a round; nothing on its path (``check 0`` and ``exit``
    answered) imports ``dataclasses``, ``typing``, ``json``, ``pathlib`` or the catalog."""
    probe = (
        "import io, sys; sys.path.insert(0, sys.argv[1]); import workloads.protocol as p; "
        "out = io.StringIO(); args = ['--workload', sys.argv[2], '--seed', '1', '--scale', "
        "'0.02', '--root', sys.argv[3], '--family', sys.argv[4]]; "
        "status = p.Session(out).serve(args, sys.argv[5:]); "
        "print(status, out.getvalue().strip()); print(' '.join(sorted(sys.modules)))"
    )
    requests = ['{"op":"check","k":0}', '{"op": "exit"}']
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(REPO), workload,
                           str(tmp_path), catalog.FAMILY[workload], *requests],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer, modules = done.stdout.splitlines()
    assert answer == '0 {"op": "checked", "k": 0, "digest": null, "validated": true}', answer
    loaded = set(modules.split())
    assert not loaded & {*HEAVY, *also_not}, sorted(loaded & {*HEAVY, *also_not})
    assert set(loads) <= loaded, sorted(set(loads) - loaded)


def test_a_workload_that_runs_tools_declares_them_for_the_payload(tmp_path: Path) -> None:
    """A round that runs a tool in a payload that did not preload ``subprocess`` fails with an
    error naming the declaration (importing it there would put it inside the round's clock)."""
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from workloads import workflow as w; w.run_tool(['true'], sys.argv[2], sys.argv[2])"
    )
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(REPO), str(tmp_path)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode != 0
    assert "subprocess is not loaded: the workload must declare it in preload" in done.stderr
    declared = {d.name: d.preload for d in catalog.DECLARED.values()}
    assert declared["repo-inspect"] == declared["incremental-build"] == ("subprocess",)


def test_no_round_imports_a_module(tmp_path: Path) -> None:
    """Whatever a workload's payload imports, it has imported by its answer to ``check 0``: no
    module is first loaded during rounds 1-3 (inside their clocks) or their checks, for any of
    the 19 workloads (the rounds run for real on a fresh copy of each fixture)."""
    from workloads.fixtures import copy_fixture, ensure_fixture

    probe = (
        "import io, sys; sys.path.insert(0, sys.argv[1]); import workloads.protocol as p\n"
        "class Out(io.StringIO):\n"
        "    seen = []\n"
        "    def write(self, s):\n"
        '        if \'"op": "checked", "k": 0\' in s: Out.seen.append(set(sys.modules))\n'
        "        return super().write(s)\n"
        "args = ['--workload', sys.argv[2], '--seed', '1', '--scale', '0.02', '--root', "
        "sys.argv[3], '--family', sys.argv[4]]\n"
        'reqs = [\'{"op": "check", "k": 0}\'] + [f\'{{"op": "{op}", "k": {k}}}\' '
        "for k in (1, 2, 3) for op in ('round', 'check')] + ['{\"op\": \"exit\"}']\n"
        "status = p.Session(Out()).serve(args, reqs)\n"
        "print(status, ' '.join(sorted(set(sys.modules) - Out.seen[0])))\n"
    )
    found = {}
    for name in catalog.DECLARED:
        workspace = tmp_path / "ws" / name
        copy_fixture(ensure_fixture(name, 1, 0.02, tmp_path / "fixtures"), workspace)
        done = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(REPO), name,
                               str(workspace), catalog.FAMILY[name]], capture_output=True,
                              text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        found[name] = done.stdout.strip()
    assert found == dict.fromkeys(catalog.DECLARED, "0"), found
