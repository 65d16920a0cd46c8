"""Run an example app's tests as a user would: in a fresh virtualenv outside the repository, with rebaser
installed from this checkout (not editable) with its ``testing`` extra, from a copy of the example's directory.
With ``--new-app NAME``, also write an app with the installed ``rebaser-server new-app NAME`` (as a newcomer
would) and run its tests, in the same virtualenv.

    python scripts/check_example.py [examples/cart ...] [--new-app ledger]

Exits with the first failing pytest's status. The virtualenv and the copies are made in a temporary directory and
removed after.
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
    parser.add_argument("examples", nargs="*", default=["examples/cart"], help="the examples' directories")
    parser.add_argument(
        "--new-app", metavar="NAME", help="also write an app with rebaser-server new-app and test it"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (and print it)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rebaser-example-"))
    try:
        env_dir = work / "venv"
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
        projects = []
        for example in (ROOT / name for name in args.examples):
            projects.append(work / "examples" / example.name)
            shutil.copytree(
                example, projects[-1], ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache")
            )
        if args.new_app:
            projects.append(work / "new" / args.new_app)
            command = [env_dir / "bin" / "rebaser-server", "new-app", args.new_app, "--dir", projects[-1]]
            subprocess.run(command, check=True)
        code = 0
        for project in projects:
            print(f"== {project.name}", flush=True)
            done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project)
            code = code or done.returncode
        return code
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
