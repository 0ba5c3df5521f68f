"""frametrace's loggers stay out of the program's log: a program that configures logging
for itself (``logging.basicConfig(level=logging.INFO)``) sees no frametrace line unless it
asks for them (FRAMETRACE_LOGS, or its own configuration of the ``frametrace`` logger),
and nothing is formatted (graphs, bytecode diffs) when nothing will print it.

Each case runs in a subprocess: logging's configuration is process-wide."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.{level}, stream=sys.stderr)
    {before}
    import torch, frametrace, frametrace.viewer, frametrace.convert
    {after}
    formatted = []
    real_diff = frametrace.convert.plain_diff       # (the bytecode log's diff, as convert calls it)
    frametrace.convert.plain_diff = lambda *a: formatted.append(1) or real_diff(*a)
    real_graph = frametrace.convert.readable_graph
    frametrace.convert.readable_graph = lambda *a: formatted.append(1) or real_graph(*a)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x).relu()
            print("between")                    # a graph break
            return y * 2

    model = frametrace.optimize(Block())
    for n in (2, 3, 4, 5):                      # recompiles (new sizes), then dynamic
        model(torch.randn(n, 8))
    model(torch.randn(2, 8, dtype=torch.float64).float())
    logging.getLogger("user").info("user line")
    print("formatted", len(formatted), file=sys.stderr)
""")


def run(level="INFO", before="", after="", env=None):
    full = dict(os.environ, OMP_NUM_THREADS="1")
    full.pop("FRAMETRACE_LOGS", None)
    full.update(env or {})
    script = SCRIPT.format(level=level, before=before, after=after)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=full, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stderr.splitlines()


def test_basic_config_info_gets_no_frametrace_lines():
    lines = run("INFO")
    assert "INFO:user:user line" in lines                 # the program's log works
    ours = [line for line in lines if "frametrace" in line]
    assert ours == [], ours[:20]
    assert "formatted 0" in lines                  # no bytecode diff or graph text was made


def test_basic_config_debug_gets_no_frametrace_lines():
    lines = run("DEBUG")
    assert not [line for line in lines if "frametrace" in line]
    assert "formatted 0" in lines


def test_frametrace_logs_print_once_on_their_own_handler():
    lines = run("INFO", env={"FRAMETRACE_LOGS": "graph_breaks,bytecode"})
    breaks = [line for line in lines if line.startswith("[frametrace.graph_breaks]")]
    assert breaks and "print" in breaks[0]
    # not again through the program's handlers
    assert not [line for line in lines if line.startswith("INFO:frametrace")]
    assert "formatted 0" not in lines


def test_the_programs_own_configuration_of_our_logger_is_honoured():
    lines = run("INFO", after='logging.getLogger("frametrace.graph_breaks").setLevel(logging.INFO)')
    assert [line for line in lines if line.startswith("INFO:frametrace.graph_breaks:")]
    assert not [line for line in lines if line.startswith("INFO:frametrace.graph:")]
    # set before the import: kept
    lines = run("INFO", before='logging.getLogger("frametrace").setLevel(logging.INFO)')
    assert [line for line in lines if line.startswith("INFO:frametrace")]
