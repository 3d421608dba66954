"""Build hook: the wheel carries ``sql/*.sql`` and ``plpython/**/*.py`` as package data.

The top-level folders stay the source of truth.  ``build_py`` copies them into the built
package as ``sabre_pg/_sql`` and ``sabre_pg/_plpython`` (never into the checkout; subfolders
kept), and ``sabre_pg.installer`` looks there first, then beside the package (a checkout or an
editable install).  The sdist carries the top-level folders (MANIFEST.in), so a wheel built
from the sdist gets the same files.  Everything else is in pyproject.toml.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# (folder at the repository root, folder inside the package, files carried)
PACKAGE_DATA = (("sql", "_sql", "*.sql"), ("plpython", "_plpython", "**/*.py"))


class build_py_with_sources(build_py):
    """build_py, then copy the SQL and PL/Python sources into the built package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return   # an editable install reads the checkout's folders directly
        for source, target, pattern in PACKAGE_DATA:
            files = sorted((ROOT / source).glob(pattern))
            if not files:
                raise SystemExit(f"setup.py: no {pattern} in {ROOT / source}: build from a checkout or an sdist")
            dest = Path(self.build_lib) / "sabre_pg" / target
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            for f in files:
                target = dest / f.relative_to(ROOT / source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)


setup(cmdclass={"build_py": build_py_with_sources})
