"""The `frametrace` command.

    python -m frametrace --version
    python -m frametrace cache [--clear]      # the on-disk cache: where, how many entries, size
    python -m frametrace diff SCRIPT.py [--fn NAME] [--no-color] [--no-pager] [--width N]
                                        [script args...]

runs SCRIPT.py (which uses frametrace.optimize) and shows, for each compiled frame,
original and transformed bytecode side by side, every resume function, the guards and
the FX graphs, with each graph break and frame left to CPython.  A script that ends in
``sys.exit(main())`` (or raises) is shown up to there.  On a terminal, output longer
than the screen is paged through ``less -R``.
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import traceback
import types
from . import __version__, convert, viewer, warm_cache


def _cache_command(clear: bool) -> int:
    if clear:
        warm_cache.clear_cache()
    info = warm_cache.cache_info()
    if not info["enabled"]:
        print("frametrace cache: off (FRAMETRACE_CACHE_DIR is empty or config.cache is False)")
        return 0
    print(f"frametrace cache: {info['dir']}\n  entries: {info['entries']}\n  size: "
          f"{info['bytes'] / 1e6:.1f} MB of {info['max_bytes'] / 1e6:.0f} MB")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="frametrace", description="frametrace tools")
    parser.add_argument("--version", action="version", version=f"frametrace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    diff = sub.add_parser("diff", help="run a script and show its compiled frames' bytecode")
    diff.add_argument("script", help="a Python script that uses frametrace.optimize")
    diff.add_argument("--fn", default=None, help="only frames of the function with this name")
    diff.add_argument("--no-color", action="store_true", help="plain text")
    diff.add_argument("--no-pager", action="store_true", help="never page the output")
    diff.add_argument("--width", type=int, default=None, help="columns (default: the terminal's)")
    cache = sub.add_parser("cache", help="what the on-disk cache of compiled entries holds")
    cache.add_argument("--clear", action="store_true", help="delete every entry")
    # Options may come before or after the script; anything else goes to the script.
    ns, script_args = parser.parse_known_args(argv)
    if ns.command == "cache":
        return _cache_command(ns.clear)

    if not os.path.isfile(ns.script):
        # (a mistyped name is the user's, not frametrace's: one line, argparse's status)
        what = "is a directory" if os.path.isdir(ns.script) else "no such file"
        print(f"frametrace diff: {ns.script}: {what}", file=sys.stderr)
        return 2

    records = []
    convert.record_observers.append(records.append)
    saved_argv = sys.argv
    sys.argv = [ns.script] + [a for a in script_args if a != "--"]
    status = 0
    # The script runs in a module this function holds until the frames are shown: an
    # entry whose guards name the script's objects (a module's `self`) is dropped when
    # they die, as they would once runpy let go of the script's globals.
    script = types.ModuleType("__main__")
    script.__file__ = os.path.abspath(ns.script)
    saved_main = sys.modules.get("__main__")
    try:
        with open(ns.script, "rb") as fh:
            code = compile(fh.read(), ns.script, "exec")
        sys.modules["__main__"] = script
        exec(code, script.__dict__)
    except SystemExit as e:
        # sys.exit(main()): what ran before the exit is what there is to show; the
        # script's exit status is ours.
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except Exception as e:
        # The script's own error, as Python would print it: from its frames on (this
        # function's frame, which ran it, is none of the user's business).
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        traceback.print_exception(type(e), e, tb)
        status = 1
    finally:
        sys.argv = saved_argv
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        convert.record_observers.remove(records.append)

    out = sys.stdout
    page = not ns.no_pager and out.isatty() and shutil.which("less") is not None
    color = False if ns.no_color else out.isatty()
    buffer = io.StringIO() if page else out
    width = ns.width or (shutil.get_terminal_size().columns if out.isatty() else None)
    shown = viewer.show_records(records, fn_name=ns.fn, color=color, file=buffer, width=width)
    if not shown:
        what = f"no compiled frame of a function named {ns.fn!r}" if ns.fn else "no compiled frames"
        names = sorted({r.code.co_name for r in records if not viewer.is_resume(r.code)})
        known = f" (compiled: {', '.join(names)})" if names else ""
        print(f"frametrace diff: {what} in {ns.script}{known}", file=sys.stderr)
        return status or 1
    if page:
        _page(buffer.getvalue(), out)
    return status


def _page(text: str, out) -> None:
    """`text` through `less -R` when it is longer than the screen, else printed."""
    if text.count("\n") < shutil.get_terminal_size().lines - 1:
        out.write(text)
        out.flush()
        return
    env = dict(os.environ, LESSCHARSET=os.environ.get("LESSCHARSET", "utf-8"))
    try:
        subprocess.run(["less", "-R"], input=text, text=True, env=env, check=False)
    except (OSError, KeyboardInterrupt):
        out.write(text)


if __name__ == "__main__":
    sys.exit(main())
