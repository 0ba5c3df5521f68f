"""The `frametrace` command.

    python -m frametrace --version
    python -m frametrace diff SCRIPT.py [--fn NAME] [--no-color] [--width N] [script args...]

runs SCRIPT.py (which uses frametrace.optimize) and shows, for each compiled frame,
original and transformed bytecode side by side, every resume function, the guards and
the FX graphs.
"""
from __future__ import annotations

import argparse
import runpy
import sys


def main(argv=None) -> int:
    from . import __version__
    parser = argparse.ArgumentParser(prog="frametrace", description="frametrace tools")
    parser.add_argument("--version", action="version", version=f"frametrace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    diff = sub.add_parser("diff", help="run a script and show its compiled frames' bytecode")
    diff.add_argument("script", help="a Python script that uses frametrace.optimize")
    diff.add_argument("--fn", default=None, help="only frames of the function with this name")
    diff.add_argument("--no-color", action="store_true", help="plain text")
    diff.add_argument("--width", type=int, default=None, help="columns (default: the terminal's)")
    # Options may come before or after the script; anything else goes to the script.
    ns, script_args = parser.parse_known_args(argv)

    from . import convert, viewer
    records = []
    convert.record_observers.append(records.append)
    saved_argv = sys.argv
    sys.argv = [ns.script] + [a for a in script_args if a != "--"]
    try:
        runpy.run_path(ns.script, run_name="__main__")
    finally:
        sys.argv = saved_argv
        convert.record_observers.remove(records.append)
    viewer.show_records(records, fn_name=ns.fn, color=False if ns.no_color else None,
                        width=ns.width)
    return 0


if __name__ == "__main__":
    sys.exit(main())
