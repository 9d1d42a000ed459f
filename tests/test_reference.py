"""bench/tools/reference.py: the committed reference pages are what the code's tables give."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.gate import budgets
from bench.gate.record import CASE_FIELDS
from bench.gate.record import RUN_FIELDS
from bench.gate.record import SERVING_FIELDS
from bench.gate.record import SETTINGS_FIELDS
from bench.tools.reference import PAGES
from bench.tools.reference import main
from kernels.ground import env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_committed_page_is_what_the_code_gives(name: str) -> None:
    assert (ROOT / "docs" / "reference" / name).read_text(encoding="utf-8") == PAGES[name](), (
        f"docs/reference/{name} is stale: run python -m bench.tools.reference --out docs/reference")


def test_every_field_variable_and_budget_key_is_on_its_page() -> None:
    records = PAGES["records.md"]()
    for fields in (RUN_FIELDS, SETTINGS_FIELDS, CASE_FIELDS, SERVING_FIELDS):
        assert all(f"| `{f.name}` " in records for f in fields)
    assert all(f"| `{v.name}` " in PAGES["environment.md"]() for v in env.VARIABLES)
    assert all(f"| `{key}` " in PAGES["budgets.md"]() for key in (*budgets.KEYS, *budgets.INFERENCE_KEYS))


def test_the_command_writes_the_pages_and_refuses_a_file_for_out(tmp_path: Path, capsys) -> None:
    assert main(["--out", str(tmp_path / "ref")]) == 0
    assert sorted(p.name for p in (tmp_path / "ref").iterdir()) == sorted(PAGES)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "file")])
    assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize("tool", ["reference", "rows", "serving"])
def test_the_data_tools_start_without_torch_or_pytest(tool: str) -> None:
    """--help with torch and pytest unimportable: reading the code's tables and the run files needs neither."""
    blocker = ("import sys, runpy\n"
               "class Block:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] in ('torch', 'pytest', '_pytest'):\n"
               "            raise ImportError(f'blocked: {name}')\n"
               "sys.meta_path.insert(0, Block())\n"
               f"sys.argv = ['bench.tools.{tool}', '--help']\n"
               "try:\n"
               f"    runpy.run_module('bench.tools.{tool}', run_name='__main__')\n"
               "except SystemExit as exc:\n"
               "    assert exc.code in (0, None), exc.code\n")
    done = subprocess.run([sys.executable, "-c", blocker], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
