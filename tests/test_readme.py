"""The README's Python snippets run as written."""

import pathlib
import re

from _scripts import run_script

README = pathlib.Path(__file__).parents[1] / "README.md"


def test_readme_snippets_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python snippets"
    script = tmp_path / "readme.py"
    script.write_text("\n".join(blocks))
    proc = run_script(script, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
