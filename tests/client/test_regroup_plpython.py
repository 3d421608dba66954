"""tools/regroup_plpython.py on small throwaway git trees: what it moves and rewrites, and
what it refuses (an unmapped module, a regrouped tree, uncommitted changes, a tree whose
imports would not go one way), changing nothing then."""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("regroup_plpython", REPO / "tools" / "regroup_plpython.py")
regroup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regroup)

FILES = {
    "plpython/anonymize.py": ("from . import common as C\nfrom . import partition, publish  # both\n\n\n"
                              "def f():\n    from .errors import thing\n    return thing\n"),
    "plpython/partition.py": "from . import scan\n",
    "plpython/publish.py": "from . import common\n",
    "plpython/scan.py": "from . import errors as E\n",
    "plpython/common.py": "from . import errors as E\nfrom ._installed import SCHEMA\n",
    "plpython/errors.py": "thing = 1\n",
    "sql/20_api.sql": ("CREATE OR REPLACE FUNCTION @schema@.sabre_anonymize_impl(x int)\n"
                       "LANGUAGE plpython3u AS $fn$\nfrom sabre_plpy import anonymize\n"
                       "return anonymize.run(plpy, x)\n$fn$;\n"),
    "tests/t.py": ('C = sabre_plpy("common")\nimport sabre_plpy.partition as p\n'
                   'path = ROOT / "plpython" / "errors.py"\nkept = sabre_plpy._installed\n'),
    "sabre_pg/installer.py": '"""After it, ``from sabre_plpy import anonymize`` works."""\n',
    "docs/architecture.md": "# Architecture\n\n## `sabre_anonymize` in four stages\n\n`plpython/anonymize.py` `run`\n",
}


def _git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def tree(tmp_path, files=FILES) -> Path:
    root = tmp_path / "repo"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    _git(root.parent, "init", "-q", str(root))
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "flat")
    return root


def test_moves_every_module_and_rewrites_every_reference(tmp_path):
    root = tree(tmp_path)
    assert regroup.main(["--repo", str(root)]) == 0
    read = lambda rel: (root / rel).read_text()   # noqa: E731
    assert sorted(str(p.relative_to(root)) for p in (root / "plpython").rglob("*.py")) == [
        "plpython/batch/anonymize.py", "plpython/batch/partition.py", "plpython/shared/common.py",
        "plpython/shared/errors.py", "plpython/stages/publish.py", "plpython/stages/scan.py"]
    assert read("plpython/batch/anonymize.py").startswith(
        "from ..shared import common as C\nfrom ..stages import publish\nfrom . import partition  # both\n")
    assert "    from ..shared.errors import thing\n" in read("plpython/batch/anonymize.py")
    assert read("plpython/batch/partition.py") == "from ..stages import scan\n"
    assert read("plpython/stages/scan.py") == "from ..shared import errors as E\n"
    assert read("plpython/shared/common.py") == "from .._installed import SCHEMA\nfrom . import errors as E\n"
    assert "from sabre_plpy.batch import anonymize\nreturn anonymize.run" in read("sql/20_api.sql")
    assert read("tests/t.py") == ('C = sabre_plpy("shared.common")\nimport sabre_plpy.batch.partition as p\n'
                                  'path = ROOT / "plpython" / "shared" / "errors.py"\nkept = sabre_plpy._installed\n')
    assert "``from sabre_plpy.batch import anonymize`` works" in read("sabre_pg/installer.py")
    doc = read("docs/architecture.md")
    assert regroup.DOC_BEGIN in doc and "`plpython/batch/anonymize.py` `run`" in doc
    assert "`anonymize.py` (`sabre_anonymize_impl`)" in doc
    status = _git(root, "status", "--porcelain")
    assert "plpython/batch/anonymize.py" in status and all(line[1] == " " for line in status.splitlines())  # staged
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "regrouped")
    assert regroup.main(["--repo", str(root)]) == 2                              # not twice


@pytest.mark.parametrize("extra, reason", [
    ({"plpython/brand_new.py": "from . import scan\n"}, "no folder for: plpython/brand_new.py"),
    ({"plpython/brand_new.py": "from . import scan\n"},
     "plpython/brand_new.py imports scan (stages); imported by none"),
    ({"plpython/errors.py": "from . import anonymize\n"}, "shared.errors: imports batch.anonymize (not a lower layer)"),
    ({"plpython/errors.py": "from . import nothing\n"}, "shared.errors: imports nothing, which is not a module"),
])
def test_refuses_and_changes_nothing(tmp_path, capsys, extra, reason):
    root = tree(tmp_path, {**FILES, **extra})
    assert regroup.main(["--repo", str(root)]) == 2
    assert reason in capsys.readouterr().err
    assert _git(root, "status", "--porcelain") == "" and not (root / "plpython" / "batch").exists()


def test_refuses_uncommitted_changes(tmp_path, capsys):
    root = tree(tmp_path)
    (root / "plpython" / "errors.py").write_text("thing = 2\n")
    assert regroup.main(["--repo", str(root)]) == 2
    assert "uncommitted changes" in capsys.readouterr().err
    assert regroup.main(["--repo", str(root), "--check"]) == 0 and not (root / "plpython" / "batch").exists()
