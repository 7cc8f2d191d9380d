"""Runs every ```python block of docs/python.md, each in a fresh namespace
(blocks that need the test model or torch are skipped without them)."""
import importlib.util
import os
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def blocks():
    if not DOC.exists():
        return []
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def block_id(code):
    first = next(line for line in code.splitlines() if line.strip() and not line.startswith("import"))
    return first[:40]


@pytest.mark.parametrize("code", blocks(), ids=block_id)
def test_doc_example_runs(code):
    if "import torch" in code or ", torch," in code:
        if importlib.util.find_spec("torch") is None:
            pytest.skip("torch is not installed")
    if "PAGEDATTN_TEST_MODEL" in code and not os.environ.get("PAGEDATTN_TEST_MODEL"):
        pytest.skip("PAGEDATTN_TEST_MODEL is not set")
    exec(compile(code, str(DOC), "exec"), {"__name__": "docs_example"})


def test_the_page_has_examples():
    if not DOC.exists():
        pytest.skip("docs/python.md is not beside the tests (an installed copy)")
    assert len(blocks()) >= 8
