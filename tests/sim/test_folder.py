"""A run never deletes what clustersim did not write (sim.folder): a user's folder, `.` or a path
that cannot be written is refused in one line, exit 2, before any simulation; a previous run's
folder is replaced; a second run into a folder being written is told so; Ctrl-C and SIGTERM end a
run within seconds with one line, exit 130 / 143, and leave no folder, hidden or not."""

import os
import signal
import subprocess
import sys
import time

import pytest

from clustersim.sim import run as run_module
from clustersim.sim.cli import main
from clustersim.sim.folder import MARKER, locked

from repo import QUICKSTART, SCENARIOS


@pytest.fixture
def no_simulation(monkeypatch):
    """A run that gets as far as simulating fails the test: the refusals must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("simulated before checking the output folder")

    monkeypatch.setattr(run_module, "simulate", refuse)


def one_line_error(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("clustersim: error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_a_users_folder_is_refused_and_its_file_survives(tmp_path, capsys, no_simulation):
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert main(["run", str(QUICKSTART), "-o", str(mine)]) == 2
    one_line_error(capsys, str(mine), f"is not a clustersim run folder (it has no {MARKER})")
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]  # no lock, no hidden sibling


def test_the_current_folder_is_refused(tmp_path, capsys, monkeypatch, no_simulation):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["run", str(QUICKSTART), "-o", "."]) == 2
    one_line_error(capsys, "is not a clustersim run folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_unwritable_path_is_refused_before_simulating(tmp_path, capsys, no_simulation):
    (tmp_path / "a-file").write_text("not a folder")
    assert main(["run", str(QUICKSTART), "-o", str(tmp_path / "a-file" / "out")]) == 2
    one_line_error(capsys, "cannot be made", "is not a folder")
    assert main(["run", str(QUICKSTART), "-o", str(tmp_path / "a-file")]) == 2
    one_line_error(capsys, "exists and is not a folder")
    assert main(["run", str(QUICKSTART), "-o", str(tmp_path / "x\0y")]) == 2
    one_line_error(capsys, "NUL byte")
    assert main(["run", str(QUICKSTART), "-o", str(tmp_path / ("n" * 300))]) == 2
    one_line_error(capsys, "at most 255 bytes")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_previous_runs_folder_is_replaced(out_dir, capsys):
    assert main(["run", str(QUICKSTART), "-o", str(out_dir), "--no-plots", "--no-trace"]) == 0
    (out_dir / "stale.txt").write_text("from an older run")  # inside a run folder: clustersim's to replace
    assert main(["run", str(QUICKSTART), "-o", str(out_dir), "--no-plots", "--no-trace"]) == 0
    assert sorted(p.name for p in out_dir.iterdir()) == [
        MARKER,
        "links.csv",
        "program.txt",
        "ranks.csv",
        "summary.json",
    ]
    assert sorted(p.name for p in out_dir.parent.iterdir()) == ["out"]


def test_a_second_run_into_a_folder_being_written_is_told_so(out_dir, capsys, no_simulation):
    with locked(out_dir):  # as a first run holds it while it simulates
        assert main(["run", str(QUICKSTART), "-o", str(out_dir)]) == 2
    one_line_error(capsys, "another clustersim run is writing this folder")
    assert not out_dir.exists()


def test_the_version_is_printed(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("clustersim ")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_mid_run_ends_it_quickly_and_leaves_nothing(tmp_path, signum, code, word):
    """The 1,024-GPU scenario simulates for seconds; the signal comes once its lock shows the run
    has started, and the run must be gone within 5 s: one line, the exit code, an empty folder."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "clustersim.sim.cli", "run", str(SCENARIOS / "gpt3_175b_1024.yaml"), "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / ".out.lock"
    deadline = time.monotonic() + 60
    while not lock.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.kill(proc.pid, signum)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 5.0
    assert proc.returncode == code
    assert err == f"clustersim: {word} ({signal.Signals(signum).name}); nothing was written\n"
    assert list(tmp_path.iterdir()) == []
