"""The import contract (docs/architecture.md, "Layers"): `lint-imports` keeps every contract in
pyproject.toml, the contract lists no exceptions, it covers every top-level module, and no import
cycle spans two folders."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = SRC / "holoflow"
INSTALL = "pip install import-linter (or pip install -e '.[test]', which includes it)"

try:
    import tomllib
except ModuleNotFoundError:          # Python 3.10
    import tomli as tomllib          # a dependency of pytest on 3.10


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _grimp():
    try:
        import grimp
    except ModuleNotFoundError:
        pytest.fail(f"grimp (installed with import-linter) is missing: {INSTALL}")
    return grimp


def test_lint_imports_keeps_every_contract():
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail(f"lint-imports is not on PATH: {INSTALL}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"lint-imports failed (see docs/architecture.md, 'Layers'):\n{r.stdout}\n{r.stderr}"
    n = len(_config()["contracts"])
    assert f"Contracts: {n} kept, 0 broken." in r.stdout, r.stdout


def test_contract_lists_no_exceptions():
    for c in _config()["contracts"]:
        assert not c.get("ignore_imports"), (
            f"contract {c['name']!r} lists ignore_imports {c['ignore_imports']}: move the code to the "
            f"layer it belongs to instead of excusing the import")
        assert c.get("allow_indirect_imports", False) is False, c["name"]


def test_facade_contract_covers_every_top_level_module():
    """Every module directly under holoflow/ is a source of the no-facade-import contract, except
    the programs written on the facade (examples, mock_torch): a new module cannot slip past it."""
    (facade,) = [c for c in _config()["contracts"] if c["type"] == "forbidden" and c["forbidden_modules"] == ["holoflow"]]
    sources = set(facade["source_modules"])
    top = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    top |= {p.parent.name for p in PKG.glob("*/__init__.py")}
    missing = sorted(m for m in top - {"examples", "mock_torch"} if f"holoflow.{m}" not in sources)
    assert not missing, (f"add these to the source_modules of {facade['name']!r} in pyproject.toml "
                         f"(as 'holoflow.X' and, for a package, 'holoflow.X.**'): {missing}")
    for m in top - {"examples", "mock_torch"}:
        if (PKG / m / "__init__.py").exists():
            assert f"holoflow.{m}.**" in sources, f"holoflow.{m}.** is missing from {facade['name']!r}"


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components (more than one module) of the module import graph."""
    adj = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(adj):
        if root in index:
            continue
        work = [(root, iter(adj[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(adj[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle_spans_folders():
    """Modules of one folder may import each other in a circle; a circle through two folders (a
    package and its subpackage, or two packages) means a layer is not real."""
    sys.path.insert(0, str(SRC))
    try:
        graph = _grimp().build_graph("holoflow", cache_dir=None)
    finally:
        sys.path.remove(str(SRC))
    packages = {m for m in graph.modules if graph.find_children(m)}
    folder = lambda m: m if m in packages else m.rsplit(".", 1)[0]
    spanning = [c for c in _cycles(graph) if len({folder(m) for m in c}) > 1]
    assert not spanning, "import cycles spanning folders:\n" + "\n".join(
        "  " + " <-> ".join(c) + "\n    " + "\n    ".join(
            f"{a} -> {b}" for a in c for b in c if graph.direct_import_exists(importer=a, imported=b))
        for c in spanning)


def test_cycle_finder_finds_a_cycle():
    """The cycle finder itself, on a graph with a known circle and a known non-circle."""
    grimp = _grimp()
    g = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c", "p.s", "p.s.x"):
        g.add_module(m)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.s.x")
    g.add_import(importer="p.s.x", imported="p.a")
    g.add_import(importer="p.c", imported="p.a")
    assert _cycles(g) == [["p.a", "p.b", "p.s.x"]]


def test_import_holoflow_leaves_torchs_compiler_stack_unimported():
    """torch._dynamo (imported by torch.nn.attention.bias, by Inductor) took about half of
    ``import holoflow``'s time, paid by every process (each rank of a launch): it is imported at
    first use; mock_torch imports it when it takes over ``import torch`` (torch's generated code
    imports torch internals by name: test_torch_distributed_api's DDP script failed without)."""
    code = ("import sys, holoflow\n"
            "assert 'torch._dynamo' not in sys.modules, 'imported with holoflow'\n"
            "holoflow.mock_torch.enable()\n"
            "import torch\n"
            "assert torch.Tensor is holoflow.Tensor and 'torch._dynamo' in sys.modules\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
