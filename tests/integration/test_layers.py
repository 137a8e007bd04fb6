"""The package's layers, held by a test: which layer may import which, and module sizes.

Read from the source (every ``import`` statement, at module level or inside a function), so a
dependency that goes the wrong way fails here, not in a reader's head:

    storage  <-  format  <-  adapter  <-  runtime  <-  compat
       ^           ^
       +--- tools -+            (tools never import the runtime, the adapter or Paddle)

``errors``, ``secrets``, ``config`` and ``threads`` are below every layer. Only the adapter, the runtime and the
compat surfaces may import Paddle; format, storage and tools never do, not even inside a function
(tests/unit/'s folders of these layers run without Paddle installed).

Inside ``format``, its floors (paddle_acp/format/__init__.py) go down alike: the on-disk formats at its top
<- ``engine``, ``commit`` <- ``checkpoints`` (:func:`test_format_floors`).
"""

import ast
import pathlib
import re
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "paddle_acp"

BASE = {"errors", "config", "threads", "secrets"}
ALLOWED: Dict[str, Set[str]] = {
    "errors": set(),
    "threads": set(),
    "config": {"errors", "secrets"},
    "secrets": set(),
    "storage": BASE,
    "format": BASE | {"storage"},
    "adapter": BASE | {"format"},
    "runtime": BASE | {"storage", "format", "adapter"},
    "tools": BASE | {"storage", "format"},
    "compat": BASE | {"storage", "format", "adapter", "runtime", "package"},
    "cli": BASE | {"package", "tools", "runtime", "compat", "storage"},
    "package": BASE | {"adapter", "runtime"},
}
MAY_IMPORT_PADDLE = {"adapter", "runtime", "compat"}
MAX_LINES = 400
# modules still over MAX_LINES while their owners split them (issue 43), each with the most it may have:
# keep the list shrinking (a module that is under the limit must leave it)
KNOWN_OVER: Dict[str, int] = {}  # none left (runtime/persist.py and runtime/range.py were split)


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    name = parts[1]
    if name in ("__main__", "auto_checkpoint", "checkpoint_saver"):
        return {"__main__": "cli", "auto_checkpoint": "compat", "checkpoint_saver": "compat"}[name]
    return name


def _modules() -> List[Tuple[str, pathlib.Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), path))
    return out


def _imports(path: pathlib.Path) -> List[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from X import a`: the module X.a when it is one, else X itself
            for a in node.names:
                full = f"{node.module}.{a.name}"
                names.append(full if full in MODULE_NAMES else node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import (the package uses absolute imports)")
    return names


MODULES = _modules()
MODULE_NAMES = {m for m, _ in MODULES}


def test_every_module_has_a_layer_and_a_docstring_saying_what_it_owns():
    for module, path in MODULES:
        assert _layer(module) in ALLOWED, f"{module}: not in a known layer"
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and doc.strip(), f"{module}: no module docstring"


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_go_down_the_layers(module, path):
    src = _layer(module)
    for name in _imports(path):
        top = name.split(".")[0]
        if top == "paddle":
            assert src in MAY_IMPORT_PADDLE, f"{module} imports Paddle ({name}); only {sorted(MAY_IMPORT_PADDLE)} may"
        if top != "paddle_acp":
            continue
        dst = _layer(name)  # `from paddle_acp import x` of a public name: the package
        if dst == src:
            continue
        assert dst in ALLOWED[src], f"{module} ({src}) imports {name} ({dst}); {src} may import {sorted(ALLOWED[src])}"


PADDLE_FREE = ("format", "storage", "tools", "errors", "config", "threads", "secrets")
_IMPORT_CALLS = {"import_module", "__import__", "find_spec", "import_fresh_module"}


def _paddle_imports(path: pathlib.Path) -> List[str]:
    """Every way ``path`` names Paddle for an import, anywhere in the file (inside functions and
    ``TYPE_CHECKING`` blocks too): import statements and import calls with a literal module name."""
    found = [n for n in _imports(path) if n.split(".")[0] == "paddle"]
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        arg = node.args[0]
        if name in _IMPORT_CALLS and isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
                and arg.value.split(".")[0] == "paddle":
            found.append(f"{name}({arg.value!r})")
    return found


@pytest.mark.parametrize("module,path", [(m, p) for m, p in MODULES if _layer(m) in PADDLE_FREE],
                         ids=[m for m, _ in MODULES if _layer(m) in PADDLE_FREE])
def test_format_storage_and_tools_never_import_paddle(module, path):
    """The on-disk format, the storage backends and the operator tools work without Paddle installed
    (their folders of tests/unit/ run so in CI: ci/test.sh); no import of it, not even inside a function."""
    found = _paddle_imports(path)
    assert not found, f"{module} imports Paddle ({', '.join(found)}): only {sorted(MAY_IMPORT_PADDLE)} may"


def test_the_paddle_import_check_sees_imports_inside_functions(tmp_path):
    """The check above finds Paddle wherever a module names it for an import."""
    src = tmp_path / "m.py"
    src.write_text("import importlib\n\ndef f():\n    import paddle.base\n\n"
                   "def g():\n    return importlib.import_module('paddle')\n\n"
                   "def h():\n    from paddle import static\n    return __import__('paddle_acp'), static\n")
    assert _paddle_imports(src) == ["paddle.base", "paddle", "import_module('paddle')"]


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_no_module_over_the_size_limit(module, path):
    lines = len(path.read_text().splitlines())
    limit = KNOWN_OVER.get(module, MAX_LINES)
    assert lines <= limit, f"{module}: {lines} lines (limit {limit}): split it by what it owns"
    if module in KNOWN_OVER:
        assert lines > MAX_LINES, f"{module}: {lines} lines, within {MAX_LINES}: remove it from KNOWN_OVER"


def _module_of(name: str) -> str:
    """The package module an imported name lives in (``paddle_acp.x.y.Name`` -> ``paddle_acp.x.y``)."""
    while name not in MODULE_NAMES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _import_cycles() -> List[List[str]]:
    """Strongly connected groups of more than one module in the import graph (every import, also those
    inside functions or under ``TYPE_CHECKING``), by Tarjan's algorithm."""
    graph = {m: sorted({_module_of(n) for n in _imports(p) if n.startswith("paddle_acp")} - {m}) for m, p in MODULES}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return groups


KNOWN_CYCLES: List[List[str]] = []  # none left: keep it so


def test_no_import_circles():
    """No module imports, directly or through others, a module that imports it."""
    new = [g for g in _import_cycles() if g not in KNOWN_CYCLES]
    assert not new, "import circles: " + "; ".join(" <-> ".join(g) for g in new)


# The floors inside format/ (paddle_acp/format/__init__.py): the on-disk formats at its top, then the engine
# (moving bytes) and commit (commit, fencing, retention), then the checkpoints (checkpointers, index, restart).
FORMAT_FLOORS = ("engine", "commit", "checkpoints")  # the subpackages; any other format module is an on-disk format
FORMAT_MAY_IMPORT: Dict[str, Set[str]] = {
    "formats": {"formats"},
    "engine": {"formats", "engine", "paddle_acp.format.commit.atomic"},  # the writer writes into a commit's directory
    "commit": {"formats", "engine", "commit"},
    "checkpoints": {"formats", "engine", "commit", "checkpoints"},
}
# (importer, imported) pairs that break the floors today, each a known debt: keep the list shrinking.
KNOWN_FLOOR_BREAKS = [
    ("paddle_acp.format.layout", "paddle_acp.format.engine.snapshot"),  # re-exports snapshot.layout (byte offsets)
]


def _format_floor(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) >= 3 and parts[2] in FORMAT_FLOORS else "formats"


def _floor_breaks() -> List[Tuple[str, str]]:
    out = []
    for module, path in MODULES:
        if _layer(module) != "format":
            continue
        allowed = FORMAT_MAY_IMPORT[_format_floor(module)]
        for name in sorted({_module_of(n) for n in _imports(path) if n.startswith("paddle_acp.format.")}):
            if _format_floor(name) not in allowed and name not in allowed:
                out.append((module, name))
    return out


def test_format_floors():
    """Inside format/, imports go down its floors too: the on-disk formats import no engine, commit or
    checkpoints module; the engine and commit never import the checkpoints (the engine only the commit
    strategy its writer writes through)."""
    breaks = _floor_breaks()
    new = [b for b in breaks if b not in KNOWN_FLOOR_BREAKS]
    assert not new, "format/ floors broken: " + "; ".join(f"{a} imports {b}" for a, b in new)
    gone = [b for b in KNOWN_FLOOR_BREAKS if b not in breaks]
    assert not gone, f"no longer broken, remove from KNOWN_FLOOR_BREAKS: {gone}"


PADDLE_INTERNALS = re.compile(r"\.get_tensor\(|\._ptr\(|\._dtype\(|\._is_initialized\(|\._place\(|framework\._\w+|\.find_var\(")


@pytest.mark.parametrize("module,path", [(m, p) for m, p in MODULES if _layer(m) in ("runtime", "compat")],
                         ids=[m for m, _ in MODULES if _layer(m) in ("runtime", "compat")])
def test_paddle_tensor_internals_only_in_the_adapter(module, path):
    """Scopes, tensors and Paddle's private framework functions are the adapter's (adapter/tensors,
    adapter/programs, ...): the runtime and compat layers go through it."""
    hits = [f"{no}: {line.strip()}" for no, line in enumerate(path.read_text().splitlines(), 1)
            if PADDLE_INTERNALS.search(line)]
    assert not hits, f"{module} touches Paddle tensor internals (move it into paddle_acp.adapter):\n" + "\n".join(hits)


# -- Paddle's public API only, outside the adapter --------------------------------------------------------------
# What the check below sees, in every runtime/ and compat/ module (the adapter is the one place for the rest):
# * every Paddle module or name an import statement names (`import paddle.x.y`, `from paddle.x import y`);
# * every dotted name rooted at a name those imports bind (`paddle.static.global_scope`, `alias.attr`), in full;
# * every getattr/hasattr/setattr with a literal private name (`getattr(program, "_is_distributed", False)`):
#   a private attribute read by name, whose object is Paddle's in these layers.
# Each must be in PUBLIC_PADDLE (or, until moved, in KNOWN_PADDLE_INTERNALS). What it does not see: a Paddle
# object reached through a call or another variable (`paddle.static.global_scope().find_var(...)`,
# `exe.place`): PADDLE_INTERNALS above catches the tensor and scope methods by name; a public-looking
# attribute of a Paddle object passed in (an Executor's `place`) is not told from any other object's.

#: The Paddle names runtime/ and compat/ may use -> the public name each is (the same object). Public: the name
#: is listed in its module's ``__all__`` (test_the_allowed_paddle_names_are_public checks it on the installed
#: Paddle), is a public module, is ``paddle.__version__``, or is in DOCUMENTED_OUTSIDE_ALL.
PUBLIC_PADDLE: Dict[str, str] = {
    "paddle": "paddle",
    "paddle.static": "paddle.static",
    "paddle.__version__": "paddle.__version__",
    "paddle.in_dynamic_mode": "paddle.in_dynamic_mode",
    "paddle.static.global_scope": "paddle.static.global_scope",
    "paddle.static.default_main_program": "paddle.static.default_main_program",
    "paddle.static.CompiledProgram": "paddle.static.CompiledProgram",
    "paddle.static.scope_guard": "paddle.static.scope_guard",
    "paddle.static.save_vars": "paddle.static.save_vars",
    "paddle.static.load_vars": "paddle.static.load_vars",
    # compat/checkpoint_saver imports it from the module that defines it
    "paddle.distributed.fleet.utils.fs.LocalFS": "paddle.distributed.fleet.utils.LocalFS",
}
#: Public modules (the static-graph API).
PUBLIC_PADDLE_MODULES = {"paddle", "paddle.static"}
#: Documented API that its module does not list in ``__all__``: Paddle's variable save/load
#: (documented as fluid.io.save_vars/load_vars, the format compat/checkpoint_saver reproduces).
DOCUMENTED_OUTSIDE_ALL = {"paddle.static.save_vars", "paddle.static.load_vars"}

#: Paddle internals the runtime and compat layers still use, (module, use) -> the adapter function that
#: replaces it. Shrink it; never grow it (a new internal goes into paddle_acp/adapter/).
KNOWN_PADDLE_INTERNALS: Dict[Tuple[str, str], str] = {}  # none left: keep it so
_ATTR_CALLS = {"getattr", "hasattr", "setattr"}


def _paddle_uses(path: pathlib.Path) -> List[Tuple[int, str]]:
    """(line, use) of every Paddle name ``path`` uses, as the comment above says."""
    tree = ast.parse(path.read_text())
    bound: Dict[str, str] = {}  # a name an import binds -> the Paddle path it stands for
    uses: List[Tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "paddle":
                    uses.append((node.lineno, a.name))
                    bound[a.asname or "paddle"] = a.name if a.asname else "paddle"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "paddle":
            for a in node.names:
                uses.append((node.lineno, f"{node.module}.{a.name}"))
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts: List[str] = []
            cur: ast.expr = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in bound:
                uses.append((node.lineno, ".".join([bound[cur.id]] + parts[::-1])))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTR_CALLS \
                and len(node.args) >= 2:
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("_") \
                    and not arg.value.startswith("__"):
                uses.append((node.lineno, f"{node.func.id}(..., {arg.value!r})"))
    return sorted(set(uses))


_OUTSIDE_ADAPTER = [(m, p) for m, p in MODULES if _layer(m) in ("runtime", "compat")]


@pytest.mark.parametrize("module,path", _OUTSIDE_ADAPTER, ids=[m for m, _ in _OUTSIDE_ADAPTER])
def test_runtime_and_compat_use_only_paddles_public_api(module, path):
    """Paddle's internals (paddle.base, private attributes, undocumented helpers) are the adapter's."""
    bad = [f"{no}: {use}" for no, use in _paddle_uses(path)
           if use not in PUBLIC_PADDLE and (module, _known_key(use)) not in KNOWN_PADDLE_INTERNALS]
    assert not bad, (f"{module} uses Paddle beyond its public API (put it behind a function in paddle_acp/adapter/, "
                     "or, if it is public, into PUBLIC_PADDLE):\n" + "\n".join(bad))


def _known_key(use: str) -> str:
    """How KNOWN_PADDLE_INTERNALS names a use (getattr, hasattr and setattr of one name alike)."""
    for call in _ATTR_CALLS:
        if use.startswith(call + "("):
            return "getattr" + use[len(call):]
    return use


def test_the_known_paddle_internals_are_still_there():
    """An internal moved into the adapter leaves KNOWN_PADDLE_INTERNALS too (the list only shrinks)."""
    found = {(m, _known_key(u)) for m, p in _OUTSIDE_ADAPTER for _, u in _paddle_uses(p)}
    stale = sorted(k for k in KNOWN_PADDLE_INTERNALS if k not in found)
    assert not stale, f"no longer used, remove from KNOWN_PADDLE_INTERNALS: {stale}"


def test_the_paddle_use_check_sees_imports_attributes_and_private_names(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import paddle\nimport paddle.base.executor as ex\nfrom paddle.static import io as sio\n\n"
                   "def f(p, exe):\n    paddle.static.global_scope().find_var('x')\n    ex.acp = None\n"
                   "    sio.is_persistable(p)\n    return getattr(p, '_is_distributed', False), getattr(exe, 'place'), "
                   "hasattr(p, '__len__')\n")
    assert _paddle_uses(src) == [
        (1, "paddle"), (2, "paddle.base.executor"), (3, "paddle.static.io"),
        (6, "paddle.static.global_scope"), (7, "paddle.base.executor.acp"), (8, "paddle.static.io.is_persistable"),
        (9, "getattr(..., '_is_distributed')"),
    ]


def _resolve(path: str) -> object:
    """The object a dotted Paddle path names on the installed Paddle (importing its modules)."""
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise AssertionError(f"{path}: no such Paddle module")


def test_the_allowed_paddle_names_are_public():
    """Each PUBLIC_PADDLE name is the object of a public name of the installed Paddle: listed in its module's
    ``__all__``, a public module, the version, or documented API (DOCUMENTED_OUTSIDE_ALL)."""
    import inspect

    pytest.importorskip("paddle")
    for used, public in PUBLIC_PADDLE.items():
        obj = _resolve(used)
        assert obj is _resolve(public), f"{used} is not {public}"
        parent, _, name = public.rpartition(".")
        if inspect.ismodule(obj):
            assert public in PUBLIC_PADDLE_MODULES, f"{public}: a module not known to be public"
        elif public != "paddle.__version__" and public not in DOCUMENTED_OUTSIDE_ALL:
            assert name in getattr(_resolve(parent), "__all__", ()), f"{public}: not in {parent}.__all__"
