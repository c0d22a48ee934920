"""Every python block of docs/*.md runs, so the docs cannot rot.

- A block runs in a fresh namespace of this process.
- A block that imports the collectives runtime runs on 2 ranks under ``launch``, as a user runs it
  (each rank printing into a file of its own: ranks sharing mpiexec's stdout can interleave).
- A Relay block (``tvm.relay``, ``tvm_combiners.relay``, ``tvm_combiners.collectives.relay``) runs in
  the Relay environment's python (``.venv-relay``), skipped where that environment does not exist.
- A line ``#> text`` in a block is output the block prints (on some rank, for a block on ranks).

Blocks of other languages (```bash, ```text, ```json) are shown, not run. The README's python
blocks are run by tests/test_readme_examples.py and tests/relay/test_readme_example.py; here, every
README python block must be one of theirs, and every relative link of the README and the docs must
point at a file (and heading) that exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
RELAY_PYTHON = ROOT / ".venv-relay" / "bin" / "python"
README_TESTS = [ROOT / "tests" / "test_readme_examples.py", ROOT / "tests" / "relay" / "test_readme_example.py"]

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
ANY_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)
RUNTIME = re.compile(r"^\s*(from|import) tvm_combiners\.collectives\.runtime\b", re.M)
RELAY = re.compile(r"^\s*(from tvm import relay\b|import tvm\.relay\b|(from|import) tvm\.relay\b"
                   r"|(from|import) tvm_combiners\.(collectives\.)?relay\b|from tvm_combiners\.collectives import relay\b)",
                   re.M)


def _blocks(page: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each python block of ``page``, line numbered from 1 at the fence."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in PYTHON_BLOCK.finditer(text)]


def _shown(code: str) -> list[str]:
    return [line[3:] for line in code.splitlines() if line.startswith("#> ")]


def _cases() -> list:
    cases = []
    for page in PAGES:
        for line, code in _blocks(page):
            on_ranks, relay = bool(RUNTIME.search(code)), bool(RELAY.search(code))
            marks = [pytest.mark.slow] if on_ranks or relay else []
            cases.append(pytest.param(page.name, line, code, on_ranks, relay, marks=marks, id=f"{page.name}:{line}"))
    return cases


CASES = _cases()


def test_the_docs_have_python_blocks():
    assert PAGES and CASES, "docs/*.md hold no python blocks: this file would test nothing"


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize(("page", "line", "code", "on_ranks", "relay"), CASES)
def test_the_block_runs(page, line, code, on_ranks, relay, tmp_path, capsys):
    python = sys.executable
    env = None
    if relay:
        if not RELAY_PYTHON.exists():
            pytest.skip(f"a Relay block: {RELAY_PYTHON.relative_to(ROOT)} does not exist (make test-relay builds it)")
        python = str(RELAY_PYTHON)
        # the checkout under test, whatever the Relay environment's editable install points at
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    prog = tmp_path / f"{page.removesuffix('.md')}_{line}.py"
    if on_ranks:
        own_stdout = ("import sys\nfrom mpi4py import MPI\n"
                      f"sys.stdout = open(f'{tmp_path}/rank{{MPI.COMM_WORLD.Get_rank()}}.txt', 'w')\n")
        prog.write_text(own_stdout + code)
        cmd = [python, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout", "240",
               "--", python, str(prog)]  # fmt: skip
        _run(cmd, 300, env)
        printed = [ln for rank in (0, 1) for ln in (tmp_path / f"rank{rank}.txt").read_text().splitlines()]
    elif relay:
        prog.write_text(code)
        printed = _run([python, str(prog)], 300, env).stdout.splitlines()
    else:
        exec(compile(code, f"docs/{page}:{line}", "exec"), {"__name__": "__docs__"})
        printed = capsys.readouterr().out.splitlines()
    missing = [line for line in _shown(code) if line not in printed]
    assert not missing, f"docs/{page}:{line} shows {missing}, but printed {printed}"


def test_every_readme_python_block_is_one_the_readme_tests_run():
    markers = [m for path in README_TESTS for m in re.findall(r"readme_block\(\"(.+?)\"\)", path.read_text())]
    assert markers
    for line, code in _blocks(README):
        found = [m for m in markers if m in code]
        assert len(found) == 1, f"README.md:{line}: a python block no README test runs (markers: {markers})"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    prose = ANY_BLOCK.sub("", page.read_text())
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose, re.M)}


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_what_exists(page):
    prose = re.sub(r"`[^`\n]*`", "", ANY_BLOCK.sub("", page.read_text()))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = page if not path else (page.parent / path).resolve()
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, broken
