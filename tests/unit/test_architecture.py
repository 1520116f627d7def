"""Imports only point down: the layers of ARCHITECTURE.md, checked over the real import graph.

The layer table in ARCHITECTURE.md is the one source: every package and top-level module under
``src/draftdata`` has a row, and every import between two of them (module level, inside a
function or under ``TYPE_CHECKING``; found with ``ast``, nothing is imported) must go to a
strictly lower layer. Inside one package, the modules import each other freely, with two
exceptions: no module may take part in an import circle (two or more modules that import each
other, directly or around a loop; counted over every import, whatever its place), and the
modules of the generate engine's table (ARCHITECTURE.md, "The generate engine") import only
down that table.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "draftdata"
DOC = ROOT / "ARCHITECTURE.md"

_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([\w.]+/?)`\s*\|", re.MULTILINE)
_ENGINE_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`generate/(\w+)\.py`\s*\|", re.MULTILINE)


def layers(doc: str) -> dict[str, int]:
    """``unit -> layer`` from the table rows (``cli/`` -> ``cli``, ``records.py`` -> ``records``,
    ``__init__.py`` -> ``draftdata``)."""
    table: dict[str, int] = {}
    for number, name in _ROW.findall(doc):
        unit = name.removesuffix("/").removesuffix(".py")
        table["draftdata" if unit == "__init__" else unit] = int(number)
    return table


def tree_units() -> set[str]:
    """The packages and top-level modules under src/draftdata, named as in ``layers``."""
    units = {"draftdata"}
    for path in SRC.iterdir():
        if path.is_dir() and (path / "__init__.py").is_file():
            units.add(path.name)
        elif path.suffix == ".py" and path.name != "__init__.py":
            units.add(path.stem)
    return units


def unit_of(module: str) -> str:
    """``draftdata.generate.stage`` -> ``generate``; ``draftdata`` -> ``draftdata``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "draftdata"


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module) of every draftdata import in ``source`` of ``module``;
    ``from draftdata import x`` counts as importing ``draftdata.x`` when x is a module."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target == "draftdata":  # `from draftdata import x`: a submodule, or a name
                found += [(node.lineno, _submodule(a.name)) for a in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, m) for line, m in found if m == "draftdata" or m.startswith("draftdata.")]


def _submodule(name: str) -> str:
    is_module = (SRC / name / "__init__.py").is_file() or (SRC / f"{name}.py").is_file()
    return f"draftdata.{name}" if is_module else "draftdata"


@dataclass(frozen=True)
class Violation:
    where: str  # path:line
    importer: str
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.imported} ({self.why})"


def check(
    module: str, source: str, table: dict[str, int], *, where: str, is_package: bool = False
) -> list[Violation]:
    """The imports of one module that do not point down."""
    out: list[Violation] = []
    src_unit = unit_of(module)
    for line, target in imported_modules(source, module, is_package):
        dst_unit = unit_of(target)
        if dst_unit == src_unit:
            continue
        if src_unit not in table or dst_unit not in table:
            out.append(Violation(f"{where}:{line}", src_unit, dst_unit, "not in the layer table"))
            continue
        a, b = table[src_unit], table[dst_unit]
        if b < a:
            why = f"layer {a} -> layer {b}: up"
        elif b == a:
            why = f"layer {a}: siblings"
        else:
            continue
        out.append(Violation(f"{where}:{line}", src_unit, dst_unit, why))
    return out


def all_violations(table: dict[str, int]) -> list[Violation]:
    out: list[Violation] = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        where = str(path.relative_to(ROOT))
        out += check(module, path.read_text(encoding="utf-8"), table, where=where,
                     is_package=is_package)  # fmt: skip
    return out


def test_the_layer_table_matches_the_tree() -> None:
    table = layers(DOC.read_text(encoding="utf-8"))
    assert sorted(tree_units() - table.keys()) == [], "in src/draftdata but not ARCHITECTURE.md"
    assert sorted(table.keys() - tree_units()) == [], "in ARCHITECTURE.md but not src/draftdata"


def test_imports_only_point_down() -> None:
    table = layers(DOC.read_text(encoding="utf-8"))
    assert [str(v) for v in all_violations(table)] == []


def test_the_check_catches_up_sibling_and_unknown_imports() -> None:
    table = {"cli": 1, "generate": 2, "tokenize": 2, "store": 3, "records": 4, "draftdata": 5}
    table["errors"] = 6

    def units(module: str, source: str, is_package: bool = False) -> list[tuple[str, str]]:
        found = check(module, source, table, where="x.py", is_package=is_package)
        return [(v.importer, v.imported) for v in found]

    # up, both absolute and lazily inside a function, and by `from draftdata import ...`
    assert units("draftdata.records", "from draftdata.store.opener import open_store") == [
        ("records", "store")
    ]
    assert units("draftdata.store.run", "def f():\n    import draftdata.cli\n") == [
        ("store", "cli")
    ]
    assert units("draftdata.records", "from draftdata import generate") == [("records", "generate")]
    # siblings, also by a relative import from a package's __init__
    assert units("draftdata.generate.stage", "from draftdata.tokenize import plan") == [
        ("generate", "tokenize")
    ]
    assert units("draftdata.generate", "from ..tokenize.plan import x", is_package=True) == [
        ("generate", "tokenize")
    ]
    # not in the table
    assert units("draftdata.cli.app", "from draftdata.newthing import x") == [("cli", "newthing")]
    # down, inside one package, the package's own version, and third-party imports are fine
    ok = (
        "from draftdata.store.read import x\nfrom draftdata.generate import work\n"
        "from . import config\nfrom draftdata import __version__\nimport msgspec\n"
    )
    assert units("draftdata.generate.stage", ok) == []
    # the package's __init__ (its version) sits low, so a higher layer may read it
    assert units("draftdata.records", "from draftdata import __version__") == []
    assert units("draftdata.errors", "from draftdata import __version__") == [
        ("errors", "draftdata")
    ]


def test_the_table_parser_reads_packages_and_modules() -> None:
    doc = "| layer | module | owns |\n|--:|--|--|\n| 1 | `cli/` | a |\n| 12 | `errors.py` | b |\n"
    doc += "| 11 | `__init__.py` | c |\n"
    assert layers(doc) == {"cli": 1, "errors": 12, "draftdata": 11}


# -- circles and the engine's layers ---------------------------------------------------------


def modules() -> dict[str, tuple[Path, bool]]:
    """``draftdata.x.y`` -> (its file, whether it is a package's ``__init__``)."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        is_package = rel.name == "__init__"
        out[".".join(rel.parts[:-1] if is_package else rel.parts)] = (path, is_package)
    return out


def module_edges(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The draftdata modules ``module`` imports (every import, wherever it stands): ``from
    pkg import name`` is an import of ``pkg.name`` when that is a module, else of ``pkg``."""
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            targets = [
                f"{target}.{a.name}" if f"{target}.{a.name}" in known else target
                for a in node.names
            ]
        else:
            continue
        for t in targets:
            while t not in known and "." in t:
                t = t.rpartition(".")[0]
            if t in known and t != module:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    """Every draftdata module -> the draftdata modules it imports."""
    mods = modules()
    known = set(mods)
    return {
        m: module_edges(path.read_text(encoding="utf-8"), m, is_package, known)
        for m, (path, is_package) in mods.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of two or more modules
    (Tarjan's algorithm, iterative), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                part: list[str] = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    part.append(w)
                    if w == v:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return sorted(found)


def test_no_import_circles() -> None:
    found = circles(import_graph())
    assert found == [], "modules that import each other (move what both need down a module)"


def test_the_circle_check_finds_loops_of_any_length() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert circles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    # `from pkg import mod` is an import of the module, `from pkg import name` of the package
    known = {"draftdata.report", "draftdata.report.page", "draftdata.report.build"}
    source = "def f():\n    from draftdata.report import page, build_report\n"
    edges = module_edges(source, "draftdata.report.forecast", False, known)
    assert edges == {"draftdata.report.page", "draftdata.report"}


def engine_layers(doc: str) -> dict[str, int]:
    """``generate module -> layer`` from ARCHITECTURE.md's engine table."""
    return {f"draftdata.generate.{m}": int(n) for n, m in _ENGINE_ROW.findall(doc)}


def test_the_engine_imports_only_down_its_layers() -> None:
    table = engine_layers(DOC.read_text(encoding="utf-8"))
    assert len(table) >= 6, "ARCHITECTURE.md has no table of the generate engine's layers"
    assert not set(table) - set(modules()), "engine rows that name no module"
    graph = import_graph()
    wrong = [
        f"{m} (layer {table[m]}) imports {t} (layer {table[t]})"
        for m in table
        for t in sorted(graph[m])
        if t in table and table[t] <= table[m]
    ]
    assert wrong == []
