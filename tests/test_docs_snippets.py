"""The Python snippets of the documentation pages run as written.

Each page's ```python blocks, concatenated in order, are one script (as a reader
copies them), run on CPU in a fresh process in an empty directory. Blocks indented
inside a list item are dedented, as Markdown does.
"""

import pathlib
import re
import textwrap

import pytest
from _scripts import run_script

DOCS = pathlib.Path(__file__).parents[1] / "docs"
# A fence at any indentation; the closing fence has the opening one's indentation.
BLOCK = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```[ \t]*$", flags=re.M | re.S)


def python_blocks(page: pathlib.Path) -> list[str]:
    return [textwrap.dedent(body) for _, body in BLOCK.findall(page.read_text())]


PAGES = sorted(p for p in DOCS.glob("**/*.md") if python_blocks(p))


def test_docs_have_python_snippets():
    assert PAGES, f"no docs page under {DOCS} has ```python blocks"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_docs_page_snippets_run(page, tmp_path):
    script = tmp_path / f"{page.stem}.py"
    script.write_text("\n".join(python_blocks(page)))
    proc = run_script(script, tmp_path, {"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, f"{page.relative_to(DOCS)} failed:\n{proc.stderr[-3000:]}"
