// C++ exceptions -> Python exceptions. Each pagedattn::Error subclass maps to
// a pagedattn.Error subclass that also derives from the built-in exception a
// Python user would catch (ValueError for bad arguments, RuntimeError for the
// rest), so both `except ValueError` and `except pagedattn.Error` work.
#include <pybind11/pybind11.h>

#include <string>

#include "bindings.h"
#include "pagedattn/errors.h"

namespace pagedattn::python {
namespace py = pybind11;
namespace {

// A new exception class module.name deriving from `bases` (a tuple). The
// returned reference is never released: the translator uses it until exit.
// Its __module__ is this module's name (pagedattn._core), as for the bound
// classes, so that the generated type stubs define it here (the package
// pagedattn re-exports it).
PyObject* new_exception(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  const std::string qualified = m.attr("__name__").cast<std::string>() + "." + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  py::object type = py::reinterpret_steal<py::object>(cls);
  m.attr(name) = type;
  return type.inc_ref().ptr();
}

}  // namespace

void register_errors(py::module_& m) {
  static PyObject *invalid_argument, *out_of_pages, *invalid_state, *unsupported, *internal;
  py::handle base =
      new_exception(m, "Error", "Base class of every error raised by pagedattn's C++ library.",
                    py::make_tuple(py::reinterpret_borrow<py::object>(PyExc_Exception)));
  auto builtin = [](PyObject* e) { return py::reinterpret_borrow<py::object>(e); };
  invalid_argument = new_exception(
      m, "InvalidArgumentError", "A bad value, size, dtype or id; the message names the argument.",
      py::make_tuple(base, builtin(PyExc_ValueError)));
  out_of_pages = new_exception(m, "OutOfPagesError",
                               "The page pool cannot hold the request; nothing was changed.",
                               py::make_tuple(base, builtin(PyExc_RuntimeError)));
  invalid_state = new_exception(m, "InvalidStateError",
                                "The call is not allowed now (e.g. attention outside a forward).",
                                py::make_tuple(base, builtin(PyExc_RuntimeError)));
  unsupported = new_exception(m, "UnsupportedError",
                              "A valid request this build or configuration cannot serve.",
                              py::make_tuple(base, builtin(PyExc_NotImplementedError)));
  internal = new_exception(m, "InternalError", "A broken invariant: a bug in pagedattn.",
                           py::make_tuple(base, builtin(PyExc_RuntimeError)));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(invalid_argument, e.what());
    } catch (const OutOfPages& e) {
      PyErr_SetString(out_of_pages, e.what());
    } catch (const InvalidState& e) {
      PyErr_SetString(invalid_state, e.what());
    } catch (const Unsupported& e) {
      PyErr_SetString(unsupported, e.what());
    } catch (const Error& e) {
      PyErr_SetString(internal, e.what());
    } catch (const py::cast_error& e) {
      // An argument of the wrong Python type that a binding converted itself
      // (pybind11's default would make it a bare RuntimeError).
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
}

}  // namespace pagedattn::python
