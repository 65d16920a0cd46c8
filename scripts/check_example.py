"""Run an example app's tests as a user would: in a fresh virtualenv outside the repository, with rebaser
installed from this checkout (not editable) with its ``testing`` extra, from a copy of the example's directory.

    python scripts/check_example.py [examples/cart]

Exits with pytest's status. The virtualenv and the copy are made in a temporary directory and removed after.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("example", nargs="?", default="examples/cart", help="the example's directory")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (and print it)")
    args = parser.parse_args(argv)
    example = (ROOT / args.example).resolve()
    work = Path(tempfile.mkdtemp(prefix="rebaser-example-"))
    try:
        env_dir, project = work / "venv", work / example.name
        venv.EnvBuilder(with_pip=True).create(env_dir)
        python = env_dir / "bin" / "python"
        # What `pip install rebaser` would get: the build files and the packages, not the whole checkout (a test
        # run beside this one writes and removes files there, coverage data among them, while it is copied).
        source = work / "rebaser"
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, source / name)
        for package in ("rebaser_core", "rebaser_client", "rebaser_server"):
            shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(
            # What the apps guide says to install: the package with its `testing` extra (pytest comes with it).
            [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"{source}[testing]"],
            check=True,
        )
        shutil.copytree(example, project, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        return subprocess.run(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project
        ).returncode
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
