"""Progress on a terminal and in a log (issue 29): under a pty (python's pty module) the
display draws a bar that never moves back, also when the pty reports 0 columns; with stderr
redirected to a file it writes plain lines, never a carriage return; ``progress.steps`` (the
benchmarks' progress) likewise."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import textwrap

import pytest

from sabre_pg.core import stopwatch
from sabre_pg.core.stopwatch import Stopwatch, observed

pytest.importorskip("tqdm")

# the phases a refine run times, in order (nested: the SA plan inside summary)
CHILD = textwrap.dedent("""
    import sys
    from sabre_pg.core import stopwatch
    from sabre_pg.core.stopwatch import Stopwatch, observed
    from sabre_pg.progress import ProgressDisplay, steps

    display = ProgressDisplay()
    sw = Stopwatch()
    with observed(display):
        stopwatch.plan(stopwatch.anonymize_plan("refine"))
        for phase in ["validate", "summary", "read", "redistribute", "hilbert", "refine", "generalize",
                      "metrics", "write_keys", "build_classes", "build_output", "check", "swap"]:
            with sw.phase(phase):
                if phase == "summary":
                    with sw.phase("bucketize"):
                        pass
                    with sw.phase("redistribute"):
                        pass
    display.close()
    with steps(5, "sabre-pg bench") as step:
        for i in range(5):
            step("run %d" % i)
""")


def run_in_pty(cols: int) -> str:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=slave, stdout=slave, stderr=slave,
                            close_fds=True)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:           # EIO: the child closed the pty
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(60) == 0, out
    return out.decode(errors="replace")


def percents(text: str, desc: str) -> list[int]:
    return [int(p) for p in re.findall(r"%s[^\r\n%%|]*?:\s*(\d+)%%\|" % re.escape(desc), text)]


@pytest.mark.parametrize("cols", [100, 0])
def test_bar_on_a_pty_never_moves_back(cols):
    out = run_in_pty(cols)
    run, bench = out.split("sabre-pg bench", 1)
    shown = percents(run, "sabre-pg")
    assert shown, out                               # something is drawn, also with 0 columns
    assert shown == sorted(shown) and shown[-1] == 100, shown
    assert "13/13" in out and "\r" in out
    assert "5/5" in bench and "[1/5]" not in bench  # the bench's steps: a bar, not lines
    widths = {len(line) for line in re.split(r"[\r\n]+", out) if "sabre-pg" in line and "|" in line}
    assert max(widths) <= (cols or 80), widths


def test_redirected_stderr_gets_plain_lines(tmp_path):
    log = tmp_path / "log"
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-c", CHILD], stderr=f, stdout=f, check=True, timeout=60)
    text = log.read_text()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "[ 1/13] validate ..." and lines[-6] == lines[-6].split(" done in ")[0] + \
        " done in " + lines[-6].split(" done in ")[1]
    steps = [int(m.group(1)) for m in map(re.compile(r"\[\s*(\d+)/13\]").match, lines) if m]
    assert steps == sorted(steps) and steps[-1] == 13
    assert "[ 2/13] summary: bucketize ..." in lines
    assert lines[-5:] == ["[%d/5] sabre-pg bench: run %d" % (i + 1, i) for i in range(5)]


def test_steps_follow_the_plan_and_never_go_back():
    events = []
    sw = Stopwatch()
    with observed(events.append):
        stopwatch.plan(("validate", "number"))
        with sw.phase("validate"):
            pass
        stopwatch.plan(("validate", "number", "advance", "advance"))
        for name in ["number", "advance", "advance"]:
            with sw.phase(name):
                with sw.phase("hilbert"):
                    pass
        with sw.phase("metrics"):       # not in the plan: stays at the last step
            pass
    assert [e["step"] for e in events] == sorted(e["step"] for e in events)
    assert [(e["step"], e["steps"]) for e in events][:2] == [(1, 2), (1, 2)]
    assert events[-1]["step"] == events[-1]["steps"] == 4
    assert [e["within"] for e in events if e["phase"] == "hilbert"] == ["number", "number", "advance", "advance",
                                                                         "advance", "advance"]
    assert not stopwatch.observing()


def test_a_partitioned_publish_repeats_phases_within_its_three_steps():
    """sabre_publish_parts times check, build_output, build_output, check, swap (its plan:
    plpython/batch/partition.py PUBLISH_STEPS)."""
    events = []
    sw = Stopwatch()
    with observed(events.append):
        stopwatch.plan(("check", "build_output", "swap"))
        for name in ["check", "build_output", "build_output", "check", "swap"]:
            with sw.phase(name):
                pass
    assert [e["step"] for e in events] == [1, 1, 2, 2, 2, 2, 2, 2, 3, 3]
    assert {e["steps"] for e in events} == {3}
