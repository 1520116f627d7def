"""Imports only point down: the layers of ARCHITECTURE.md, checked over the real import graph.

ARCHITECTURE.md's tables are the one source, and the folders show them:

- "Layers": every package and top-level module under ``src/draftdata`` has a row, and so has
  each module of a *layer folder* (``shared/``, ``support/``: a folder whose own row stands
  above rows of its modules, ``shared/mix.py``). A layer folder holds exactly one layer: its
  modules' rows carry its layer, and no row of that layer stands outside it. Every import
  between two rows (module level, inside a function or under ``TYPE_CHECKING``; found with
  ``ast``, nothing is imported) must go to a strictly lower layer, so two modules of one layer
  folder never import each other.
- "generate's floors": the same for the folders and root modules of ``generate/``.
- "The generate engine": the modules of the engine's table import only down that table.

Inside one row's package the modules import each other freely, except that no module anywhere
may take part in an import circle (two or more modules that import each other, directly or
around a loop; counted over every import, whatever its place).
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

_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([\w./]+)`\s*\|", re.MULTILINE)
LAYERS = "## Layers"
GENERATE = "## generate's floors"
ENGINE = "## The generate engine"


def section(doc: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or above."""
    level = heading.split(" ")[0]
    start = doc.index(heading + "\n")
    stop = re.compile(f"^#{{1,{len(level)}}} ", re.MULTILINE).search(doc, start + len(heading))
    return doc[start : stop.start() if stop else len(doc)]


def layers(doc: str) -> dict[str, int]:
    """``unit -> layer`` from a table's rows: ``cli/`` -> ``cli``, ``shared/mix.py`` ->
    ``shared/mix``, ``shared/readers/`` -> ``shared/readers``, ``__init__.py`` ->
    ``draftdata``."""
    table: dict[str, int] = {}
    for number, name in _ROW.findall(doc):
        unit = name.removesuffix("/").removesuffix(".py")
        table["draftdata" if unit == "__init__" else unit] = int(number)
    return table


def layer_folders(doc: str) -> dict[str, int]:
    """The folders of a table whose modules have rows of their own (``shared/`` above
    ``shared/mix.py``), with the folder's layer."""
    names = [name for _, name in _ROW.findall(doc)]
    table = layers(doc)
    return {
        name.removesuffix("/"): table[name.removesuffix("/")]
        for name in names
        if name.endswith("/") and any(n.startswith(name) and n != name for n in names)
    }


def units_in(folder: Path, prefix: str) -> set[str]:
    """The packages and modules of ``folder`` named as in ``layers`` (``prefix/name``)."""
    out = set()
    for path in folder.iterdir():
        if path.is_dir() and (path / "__init__.py").is_file():
            out.add(prefix + path.name)
        elif path.suffix == ".py" and path.name != "__init__.py":
            out.add(prefix + path.stem)
    return out


def tree_units(folders: dict[str, int]) -> set[str]:
    """The units under src/draftdata: its packages and modules, and in a layer folder the
    folder and each of its packages and modules."""
    units = {"draftdata"}
    for unit in units_in(SRC, ""):
        if unit in folders:
            units |= {unit, *units_in(SRC / unit, unit + "/")}
        else:
            units.add(unit)
    return units


def unit_of(module: str, table: dict[str, int], depth: int = 1) -> str:
    """The row ``module`` belongs to: the longest row its path starts with
    (``draftdata.shared.readers.base`` -> ``shared/readers``, ``draftdata.generate.stage`` ->
    ``generate``); ``draftdata`` -> ``draftdata``; else the first ``depth`` parts of its path
    (a unit the table lacks)."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if "/".join(parts[:n]) in table:
            return "/".join(parts[:n])
    return "/".join(parts[:depth]) if parts else "draftdata"


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module) of every draftdata import in ``source`` of ``module``;
    ``from draftdata.x import y`` counts as importing ``draftdata.x.y`` when y is a module."""
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
            found += [(node.lineno, _submodule(target, a.name)) for a in node.names]
    return [(line, m) for line, m in found if m == "draftdata" or m.startswith("draftdata.")]


def _submodule(package: str, name: str) -> str:
    """``package.name`` when that is a module or package under src, else ``package``."""
    folder = SRC.parent.joinpath(*package.split("."))
    is_module = (folder / name / "__init__.py").is_file() or (folder / f"{name}.py").is_file()
    return f"{package}.{name}" if is_module else package


@dataclass(frozen=True)
class Violation:
    where: str  # path:line
    importer: str
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.imported} ({self.why})"


def check(
    module: str,
    source: str,
    table: dict[str, int],
    *,
    where: str,
    is_package: bool = False,
    scope: str = "draftdata",
) -> list[Violation]:
    """The imports of one module that do not point down; with ``scope`` a package, only the
    imports between two modules inside it."""
    out: list[Violation] = []
    inside = (lambda m: m.startswith(scope + ".")) if scope != "draftdata" else (lambda m: True)
    if not inside(module):
        return out
    depth = len(scope.split("."))
    src_unit = unit_of(module, table, depth)
    for line, target in imported_modules(source, module, is_package):
        if not inside(target):
            continue
        dst_unit = unit_of(target, table, depth)
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


def all_violations(table: dict[str, int], scope: str = "draftdata") -> list[Violation]:
    out: list[Violation] = []
    for module, (path, is_package) in modules().items():
        where = str(path.relative_to(ROOT))
        out += check(module, path.read_text(encoding="utf-8"), table, where=where,
                     is_package=is_package, scope=scope)  # fmt: skip
    return out


def misplaced(doc: str) -> list[str]:
    """Rows at the wrong floor of a layer folder: a module of the folder at another layer, or
    a row of the folder's layer outside it (the package's own ``__init__.py`` aside)."""
    table = layers(doc)
    out = []
    for folder, layer in layer_folders(doc).items():
        for unit, n in sorted(table.items()):
            mine = unit.startswith(folder + "/")
            if mine and n != layer:
                out.append(f"{unit} is in {folder}/ (layer {layer}) but at layer {n}")
            elif n == layer and not mine and unit not in (folder, "draftdata"):
                out.append(f"{unit} is at layer {layer}, so it belongs in {folder}/")
    return out


def test_the_layer_table_matches_the_tree() -> None:
    doc = section(DOC.read_text(encoding="utf-8"), LAYERS)
    table, folders = layers(doc), layer_folders(doc)
    assert folders, "ARCHITECTURE.md's layer table names no layer folder"
    units = tree_units(folders)
    assert sorted(units - table.keys()) == [], "in src/draftdata but not ARCHITECTURE.md"
    assert sorted(table.keys() - units) == [], "in ARCHITECTURE.md but not src/draftdata"


def test_a_layer_folder_holds_its_layer_and_only_it() -> None:
    assert misplaced(section(DOC.read_text(encoding="utf-8"), LAYERS)) == []


def test_imports_only_point_down() -> None:
    table = layers(section(DOC.read_text(encoding="utf-8"), LAYERS))
    assert [str(v) for v in all_violations(table)] == []


def test_generate_s_folders_match_its_floors() -> None:
    table = layers(section(DOC.read_text(encoding="utf-8"), GENERATE))
    units = units_in(SRC / "generate", "generate/")
    assert sorted(units - table.keys()) == [], "in generate/ but not in its floors' table"
    assert sorted(table.keys() - units) == [], "in the floors' table but not in generate/"
    assert any((SRC / u).is_dir() for u in table), "generate/ has no folders"


def test_generate_imports_only_down_its_floors() -> None:
    table = layers(section(DOC.read_text(encoding="utf-8"), GENERATE))
    assert [str(v) for v in all_violations(table, scope="draftdata.generate")] == []


def test_the_check_catches_up_sibling_and_unknown_imports() -> None:
    table = {"cli": 1, "generate": 2, "tokenize": 2, "store": 3, "records": 4, "draftdata": 5}
    table |= {"errors": 6, "low": 4, "low/a": 4, "low/b": 4}

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
    # two modules of one layer folder are siblings, however they are imported
    assert units("draftdata.low.a", "from draftdata.low.b import x") == [("low/a", "low/b")]
    assert units("draftdata.low.a", "import draftdata.low.b as b") == [("low/a", "low/b")]
    # a layer folder's module is below what stands above the folder, above what stands below
    assert units("draftdata.store.run", "from draftdata.low.a import x") == []
    assert units("draftdata.low.b", "from draftdata.store import run") == [("low/b", "store")]
    assert units("draftdata.low.b", "from draftdata.errors import x") == []
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


def test_a_scoped_check_sees_only_the_package_s_own_imports() -> None:
    table = {"generate/top": 1, "generate/mid": 2, "generate/low": 3}

    def units(module: str, source: str) -> list[tuple[str, str]]:
        found = check(module, source, table, where="x.py", scope="draftdata.generate")
        return [(v.importer, v.imported) for v in found]

    # a module in a folder belongs to the folder's row; up and unknown are caught
    assert units("draftdata.generate.low.x", "from draftdata.generate.mid.y import z") == [
        ("generate/low", "generate/mid")
    ]
    assert units("draftdata.generate.mid", "from draftdata.generate.new import z") == [
        ("generate/mid", "generate/new")
    ]
    # down is fine, and what is outside the package is not this check's business
    assert units("draftdata.generate.top", "from draftdata.generate.low.x import z") == []
    assert units("draftdata.generate.low.x", "from draftdata.cli import app") == []
    assert units("draftdata.store.run", "from draftdata.generate.top import z") == []


def test_the_table_parser_reads_packages_modules_and_layer_folders() -> None:
    doc = "| layer | module | owns |\n|--:|--|--|\n| 1 | `cli/` | a |\n| 12 | `errors.py` | b |\n"
    doc += "| 11 | `__init__.py` | c |\n| 9 | `low/` | d |\n| 9 | `low/mix.py` | e |\n"
    doc += "| 9 | `low/readers/` | f |\n"
    assert layers(doc) == {
        "cli": 1,
        "errors": 12,
        "draftdata": 11,
        "low": 9,
        "low/mix": 9,
        "low/readers": 9,
    }
    assert layer_folders(doc) == {"low": 9}
    assert misplaced(doc) == []
    # a module of the folder at another layer, a row of the folder's layer outside it
    wrong = doc + "| 10 | `low/x.py` | g |\n| 9 | `y.py` | h |\n"
    assert misplaced(wrong) == [
        "low/x is in low/ (layer 9) but at layer 10",
        "y is at layer 9, so it belongs in low/",
    ]
    text = "# A\n## Layers\none\n### sub\ntwo\n## Next\nthree\n"
    assert section(text, "## Layers") == "## Layers\none\n### sub\ntwo\n"


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
    """``module -> layer`` from a table of files (``generate/engine/loop.py`` ->
    ``draftdata.generate.engine.loop``)."""
    return {
        "draftdata." + name.removesuffix(".py").replace("/", "."): int(n)
        for n, name in _ROW.findall(doc)
        if name.endswith(".py")
    }


def test_the_engine_imports_only_down_its_layers() -> None:
    table = engine_layers(section(DOC.read_text(encoding="utf-8"), ENGINE))
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
