"""The type stubs shipped in the package cover the compiled module, and every
public name has a docstring."""
import ast
import inspect
import pathlib

import pagedattn
import pagedattn._core as core
from pagedattn import ops

PACKAGE = pathlib.Path(pagedattn.__file__).parent


def stub_names(path):
    """{top-level name: set of member names} declared in a .pyi file."""
    names = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    members.add(member.name)
                elif isinstance(member, ast.AnnAssign):
                    members.add(member.target.id)
            names[node.name] = members
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = set()
    return names


def public(names):
    return {n for n in names if not n.startswith("_")}


def test_the_package_is_typed():
    assert (PACKAGE / "py.typed").exists()


def test_core_stub_declares_every_public_class_member_and_function():
    stubs = stub_names(PACKAGE / "_core.pyi")
    for name in public(dir(core)) - {"ops"}:
        obj = getattr(core, name)
        assert name in stubs, f"_core.pyi lacks {name}"
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            missing = public(vars(obj)) - stubs[name]
            assert not missing, f"_core.pyi: {name} lacks {sorted(missing)}"


def test_ops_stub_declares_every_operator():
    stubs = stub_names(PACKAGE / "ops.pyi")
    assert set(ops.__all__) <= set(stubs)


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
