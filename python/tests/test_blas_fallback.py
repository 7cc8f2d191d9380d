"""OpenBLAS on its generic kernels: importing pagedattn says so, and names the
OPENBLAS_CORETYPE to start Python with (it is read only when OpenBLAS loads)."""

import warnings

import pytest

import pagedattn
import pagedattn._core as core


def test_a_fallback_warns_and_names_the_cores_kernels(monkeypatch):
    monkeypatch.setattr(core, "_blas_core_instead_of_fallback", lambda: "SkylakeX")
    with pytest.warns(RuntimeWarning, match="OPENBLAS_CORETYPE=SkylakeX"):
        pagedattn._warn_if_blas_fell_back()


def test_openblas_own_choice_is_silent(monkeypatch):
    monkeypatch.setattr(core, "_blas_core_instead_of_fallback", lambda: "")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pagedattn._warn_if_blas_fell_back()


def test_this_process_answers_a_core_name_or_nothing():
    assert core._blas_core_instead_of_fallback() in ("", "SkylakeX", "Haswell")
