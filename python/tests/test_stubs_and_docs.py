"""The type stubs shipped in the package cover the compiled module, and every
public name has a docstring.

The stubs of pagedattn._core and its submodule ops are generated from the
bindings by pybind11-stubgen when the module is built (python/CMakeLists.txt):
a stub package pagedattn/_core/{__init__,ops}.pyi beside the extension module.
These tests read the stubs of the package under test, so they fail when the
build did not generate or install them, or when a binding lost a name, a
parameter name or a type."""
import ast
import importlib.metadata
import inspect
import pathlib
import re

import pytest

import pagedattn
import pagedattn._core as core
from pagedattn import ops

PACKAGE = pathlib.Path(pagedattn.__file__).parent
CORE_STUB = PACKAGE / "_core" / "__init__.pyi"
OPS_STUB = PACKAGE / "_core" / "ops.pyi"
STUB_FILES = ("pagedattn/py.typed", "pagedattn/_core/__init__.pyi", "pagedattn/_core/ops.pyi")

# Where the stubs may say typing.Any: values of several types (a GGUF metadata
# value; dicts of int, float, str, bool and list values), which callers know
# by key. Everywhere else a binding must name its types.
DELIBERATE_ANY = {"KVCache.config", "GgufFile.get", "GgufFile.model_config", "GgufFile.tensors"}


def parse(path):
    return ast.parse(path.read_text(), filename=str(path))


def stub_names(path):
    """{top-level name: (kind, set of member names)} declared in a .pyi file;
    kind is "class", "def", "attribute" or "import"."""
    names = {}
    for node in parse(path).body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    members.add(member.name)
                elif isinstance(member, ast.AnnAssign):
                    members.add(member.target.id)
            names[node.name] = ("class", members)
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = ("def", set())
        elif isinstance(node, ast.AnnAssign):
            names[node.target.id] = ("attribute", set())
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                names[alias.asname or alias.name] = ("import", set())
    return names


def stub_functions(path):
    """(qualified name, FunctionDef) of every function and method of a .pyi file."""
    for node in parse(path).body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    yield f"{node.name}.{member.name}", member


def is_setter(function):
    return any(isinstance(d, ast.Attribute) and d.attr == "setter"
               for d in function.decorator_list)


def public(names):
    return {n for n in names if not n.startswith("_")}


def test_the_package_is_typed():
    assert (PACKAGE / "py.typed").exists()


def test_the_stubs_lie_beside_the_compiled_module():
    assert pathlib.Path(core.__file__).parent == PACKAGE
    for stub in (CORE_STUB, OPS_STUB):
        assert stub.is_file(), f"{stub} is missing: the build generates it (pybind11-stubgen)"


def test_the_installed_distribution_ships_the_stubs():
    try:
        distribution = importlib.metadata.distribution("pagedattn")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pagedattn is imported from a build tree, not an installed distribution")
    if pathlib.Path(distribution.locate_file("pagedattn")).resolve() != PACKAGE.resolve():
        pytest.skip(f"pagedattn is imported from {PACKAGE}, not from the installed distribution")
    recorded = {str(f) for f in distribution.files or ()}
    missing = [f for f in STUB_FILES if f not in recorded]
    assert not missing, f"the installed pagedattn does not list {missing} (its RECORD)"


def check_module_stub(module, path):
    stubs = stub_names(path)
    for name in public(dir(module)):
        obj = getattr(module, name)
        assert name in stubs, f"{path.name} lacks {name}"
        kind, members = stubs[name]
        if inspect.isclass(obj):
            # Defined in the stub, not imported (an import from the package
            # pagedattn, which imports it from here, would be a cycle).
            assert kind == "class", f"{path.name}: {name} is no class definition ({kind})"
            definition = next(n for n in parse(path).body
                              if isinstance(n, ast.ClassDef) and n.name == name)
            assert (ast.get_docstring(definition) or "") == inspect.cleandoc(obj.__doc__ or ""), \
                f"{path.name}: {name}'s docstring is not the binding's"
            if not issubclass(obj, BaseException):
                missing = public(vars(obj)) - members
                assert not missing, f"{path.name}: {name} lacks {sorted(missing)}"
        elif inspect.ismodule(obj):
            assert kind == "import", f"{path.name}: {name} is not its submodule"
        elif callable(obj):
            assert kind == "def", f"{path.name}: {name} is no function ({kind})"


def test_core_stub_declares_every_public_name():
    check_module_stub(core, CORE_STUB)


def test_ops_stub_declares_every_operator():
    check_module_stub(core.ops, OPS_STUB)
    assert set(ops.__all__) <= set(stub_names(OPS_STUB))
    # pagedattn.ops re-exports them: type checkers follow it into the stub.
    for name in ops.__all__:
        assert getattr(ops, name) is getattr(core.ops, name)


def test_stub_parameters_have_their_names():
    # pybind11 names a parameter argN when its binding has no py::arg; a
    # property setter's value is the one such parameter a stub may show.
    unnamed = []
    for path in (CORE_STUB, OPS_STUB):
        for name, function in stub_functions(path):
            if is_setter(function):
                continue
            args = function.args
            for arg in args.posonlyargs + args.args + args.kwonlyargs:
                if re.fullmatch(r"arg\d+", arg.arg):
                    unnamed.append(f"{name}({arg.arg})")
    assert not unnamed, unnamed


def test_stubs_type_any_only_where_deliberate():
    def mentions_any(annotation):
        return annotation is not None and any(
            isinstance(n, ast.Attribute) and n.attr == "Any" or
            isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(annotation))

    with_any = set()
    for path in (CORE_STUB, OPS_STUB):
        for name, function in stub_functions(path):
            args = function.args
            annotations = [a.annotation for a in args.posonlyargs + args.args + args.kwonlyargs]
            annotations += [a.annotation for a in (args.vararg, args.kwarg) if a is not None]
            if any(map(mentions_any, annotations + [function.returns])):
                with_any.add(name)
    assert with_any == DELIBERATE_ANY, (
        f"typed Any: {sorted(with_any - DELIBERATE_ANY)} (use python/src/type_hints.h); "
        f"no longer Any: {sorted(DELIBERATE_ANY - with_any)}")


def test_array_arguments_and_results_are_numpy_types():
    functions = dict(stub_functions(CORE_STUB))
    assert ast.unparse(functions["KVCache.attention"].args.args[2].annotation) == \
        "numpy.typing.ArrayLike"
    assert ast.unparse(functions["BatchPlan.kv_indices"].returns) == \
        "numpy.typing.NDArray[numpy.int32]"
    ops_functions = dict(stub_functions(OPS_STUB))
    assert ast.unparse(ops_functions["paged_attention_decode"].returns) == "numpy.ndarray"


def has_doc(obj):
    doc = inspect.getdoc(obj) or ""
    # pybind11 puts the signature first: a docstring must say more than that.
    lines = [line for line in doc.splitlines() if line.strip()]
    return len(lines) > 1 or (len(lines) == 1 and "->" not in lines[0])


def test_every_public_name_has_a_docstring():
    missing = []
    for name in pagedattn.__all__:
        obj = getattr(pagedattn, name)
        if name != "__version__" and not has_doc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if member.startswith("_"):
                    continue
                target = value.__func__ if isinstance(value, staticmethod) else value
                if not has_doc(target):
                    missing.append(f"{name}.{member}")
    missing += [f"ops.{n}" for n in ops.__all__ if not has_doc(getattr(ops, n))]
    assert not missing, missing
