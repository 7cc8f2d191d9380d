// pagedattn._core: the compiled half of the Python package (python/pagedattn
// re-exports it with the public names).
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "pagedattn/engine.h"
#include "pagedattn/version.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "pagedattn's C++ library bound with pybind11; use the package pagedattn.";
  m.attr("__version__") = pagedattn::kVersion;
  m.def(
      "_blas_core_instead_of_fallback", [] { return pagedattn::blas_core_instead_of_fallback(); },
      "The OPENBLAS_CORETYPE to start Python with where OpenBLAS fell back to its generic "
      "kernels on this CPU; '' otherwise.");
  pagedattn::python::register_errors(m);
  pagedattn::python::register_plan_views(m);
  pagedattn::python::register_kv_cache(m);
  pagedattn::python::register_ops(m);
  pagedattn::python::register_models(m);
  pagedattn::python::register_gguf(m);
  pagedattn::python::register_tokenizer(m);
  pagedattn::python::register_engine(m);
#if defined(PAGEDATTN_HAVE_CUDA)
  pagedattn::python::register_cuda(m);
#endif
}
