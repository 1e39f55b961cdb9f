"""The cheap commands of the README and its guides print what the text says they print (issue 41,
edge 3).

Each case names a command of a ``bash`` block of README.md or a guide in docs/ by its start; the test
takes the numbers the comment quotes for it, runs the command exactly as written, and checks that its
output gives the same numbers at the precision the text quotes. An edit of the text or a code change
that moves a number fails here. Only commands of a few seconds are run (the whole file: about 10 s).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tests.warm_launcher import run_module

ROOT = Path(__file__).resolve().parent.parent
NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
# the README and the guides that hold the manual it once was: they describe the code as it is
MANUAL = ("README.md", "docs/EXPERIMENTS.md", "docs/ALGORITHMS.md", "docs/SECURE_AGGREGATION.md",
          "docs/ACCOUNTING.md", "docs/DEPLOYMENT.md", "docs/STACKOVERFLOW.md", "docs/HF_MODELS.md",
          "docs/PUBLIC_DATA.md", "docs/CLIPPING.md", "docs/OUTPUTS.md")


def documents() -> list[Path]:
    """README.md and every guide in docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# (start of the command, the comment's pattern, the output's pattern): the same groups in order
CASES = {
    "balls_in_bins_epsilon": (
        "-m fedpriv.accounting epsilon --noise-multiplier 1.5 --sampling balls_in_bins --bins 66",
        rf"epsilon = {NUMBER} \(upper bound; estimate {NUMBER}\)",
        rf"epsilon = {NUMBER} \(upper bound at confidence 0\.999; estimate {NUMBER}\)"),
    "ddgauss_plan": (
        "-m fedpriv.accounting ddgauss --target-epsilon 2 --delta 1e-5 --sampling-rate 0.01 --rounds 100",
        rf"noise multiplier {NUMBER} = {NUMBER}x the central {NUMBER}",
        rf"summed noise multiplier {NUMBER} is {NUMBER}x the central Gaussian's {NUMBER}"),
    "gboard_tree_epsilon": (
        "-m fedpriv.accounting epsilon --mechanism tree --noise-multiplier 7.0 --rounds 2000",
        rf"epsilon = {NUMBER}, sum of sensitivity\^2 {NUMBER} \(exact\)",
        rf"epsilon = {NUMBER} at .* sum of sensitivity\^2 {NUMBER} \(exact\)"),
}


def readme_commands() -> list[tuple[str, str]]:
    """(command, its trailing comment) for each line of the ``bash`` blocks of the README and the
    guides in docs/, with backslash continuations joined."""
    text = "\n".join(path.read_text() for path in documents())
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            command, _, comment = line.partition("#")
            if command.strip():
                out.append((" ".join(command.split()), comment.strip()))
    return out


def _quoted(command_start: str) -> tuple[str, str]:
    found = [(c, note) for c, note in readme_commands() if command_start in c]
    assert len(found) == 1, f"the README and docs/ have {len(found)} commands with {command_start!r}"
    return found[0]


def _agrees(printed: str, quoted: str) -> bool:
    """``printed`` rounded to the decimals ``quoted`` has equals ``quoted``."""
    decimals = len(quoted.partition(".")[2])
    return f"{float(printed):.{decimals}f}" == quoted


def _python(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``python ARGS`` at the repository root: ``-m MODULE ...`` in a fresh process forked warm
    (tests/warm_launcher.py), a script in a fresh interpreter."""
    if args[0] == "-m":
        return run_module(args[1], *args[2:], cwd=ROOT, env=env, timeout=timeout)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_readme_command_prints_the_numbers_the_readme_quotes(case):
    start, comment_pattern, output_pattern = CASES[case]
    command, comment = _quoted(start)
    quoted = re.search(comment_pattern, comment)
    assert quoted, f"the comment for {start!r} no longer reads {comment_pattern!r}: {comment!r}"
    argv = shlex.split(command)
    assert argv[0] == ".venv/bin/python"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = _python(argv[1:], env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    printed = re.search(output_pattern, res.stdout)
    assert printed, f"{command!r} printed {res.stdout!r}"
    for got, want in zip(printed.groups(), quoted.groups()):
        assert _agrees(got, want), f"{command!r} prints {printed.group(0)!r}; the text says {quoted.group(0)!r}"


def test_the_readme_carries_no_issue_number():
    """The README and the guides that hold its former manual describe the code as it is, not the
    history of its issues (issue 52, item 11)."""
    text = "\n".join((ROOT / name).read_text() for name in MANUAL)
    found = re.findall(r"[^\n]*\b[Ii]ssues? #?[0-9]+[^\n]*", text)
    assert found == []


def test_an_outputs_in_comment_names_the_directory_its_command_writes():
    """A comment ``outputs in PATH`` (README or docs/) after a ``fedpriv.simulate`` command names that
    command's ``run_dir``, or Hydra's default ``outputs/DATE/TIME`` when it sets none."""
    text = "\n".join(path.read_text() for path in documents())
    checked = 0
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        command = None
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            code, _, comment = line.partition("#")
            if "fedpriv.simulate" in code:
                command = code
            said = re.search(r"outputs in (\S+)", comment)
            if said and command is not None:
                run_dir = re.search(r"\brun_dir=(\S+)", command)
                assert said.group(1).endswith(run_dir.group(1) if run_dir else "outputs/DATE/TIME"), line
                checked += 1
    assert checked


def _own_text(directory: Path, users: int = 90) -> None:
    """``users.jsonl`` (``users`` users of 2 to 4 rows over the tiny words, rows shuffled) and
    ``public.txt`` (other sentences over the same words) under ``directory``."""
    import json
    import random

    from fedpriv.data.files import TINY_WORDS

    rng = random.Random(1)  # test data
    weights = [1.0 / rank for rank in range(1, len(TINY_WORDS) + 1)]

    def text() -> str:
        return ". ".join(" ".join(rng.choices(TINY_WORDS, weights, k=rng.randint(3, 8)))
                         for _ in range(rng.randint(1, 2))) + "."

    rows = [{"user": f"u{u:03d}", "text": text()} for u in range(users) for _ in range(rng.randint(2, 4))]
    rng.shuffle(rows)
    (directory / "users.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "public.txt").write_text("".join(text() + "\n" for _ in range(300)))


def test_your_own_text_goes_from_a_json_lines_file_to_a_planned_run(tmp_path, monkeypatch, capsys):
    """README "Your own text": its three commands as written (their ``main(argv)``, in-process), in a
    directory holding a generated ``users.jsonl`` and ``public.txt``. ``word-counts`` writes
    ``words.txt``; ``inspect`` reads it, counts the train users and prints, as the command to run
    next, the README's third command with N = that count; and that command plans (``python -m
    fedpriv.plan`` on its settings: the run's own checks and its plan, without training). Nothing is
    written under HOME."""
    from fedpriv.data.__main__ import main as data_main
    from fedpriv.plan.__main__ import main as plan_main

    _own_text(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FEDPRIV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)

    def argv(start: str, module: str, population: int | None = None) -> list[str]:
        """The arguments of the README's command that starts so (N: ``population``)."""
        command, _ = _quoted(start)
        if population is not None:
            command = command.replace(" population=N ", f" population={population} ")
        words = shlex.split(command)
        assert words[:3] == [".venv/bin/python", "-m", module]
        return words[3:]

    data_main(argv("-m fedpriv.data word-counts", "fedpriv.data"))
    words = [line.split("\t")[0] for line in (tmp_path / "words.txt").read_text().splitlines()]
    assert words[:2] == [".", "w1"]  # normalised as data=files reads the users' rows: punctuation is a token
    capsys.readouterr()
    data_main(argv("-m fedpriv.data inspect data=files data.path=users.jsonl", "fedpriv.data"))
    out = capsys.readouterr().out
    users = int(re.search(r"^users: ([0-9,]+) train", out, flags=re.M).group(1).replace(",", ""))
    assert users > 32  # plan=auto's least population
    planned, _ = _quoted("-m fedpriv.simulate data=files data.path=users.jsonl")
    assert " population=N " in planned
    said = re.search(r"^next: (.*)$", out, flags=re.M).group(1)
    assert said == planned.replace(".venv/bin/python", "python").replace(" population=N ", f" population={users} ")
    plan_main(argv("-m fedpriv.simulate data=files data.path=users.jsonl", "fedpriv.simulate", users))
    plan = capsys.readouterr().out
    assert plan.startswith("plan: cohort ") and "for epsilon 8 at" in plan and f"population={users} " in plan
    assert not any(home.iterdir())


@pytest.mark.slow
def test_the_planned_smoke_run_ends_where_the_readme_and_planner_say(tmp_path):
    """README "First steps" (step 3) and docs/PLANNER.md quote the 200-round ``plan=auto`` smoke run:
    its plan (σ, server lr), its final accuracy and its test loss, falling at every evaluation from
    the first to the last. The run (about 30 s) is the README's command in a temporary directory."""
    import json

    readme = re.search(r"With `plan=auto` it trains: accuracy ([0-9.]+), test loss falling ([0-9.]+) → ([0-9.]+)",
                       (ROOT / "README.md").read_text())
    planner_text = " ".join((ROOT / "docs" / "PLANNER.md").read_text().split())
    planner = re.search(r"σ ([0-9.]+), server lr ([0-9.]+) .*? ends at accuracy ([0-9.]+) \(unigram [0-9.]+\) with "
                        r"its test loss falling at every evaluation, ([0-9.]+) → ([0-9.]+)", planner_text)
    assert readme and planner, "the README's or PLANNER.md's sentence no longer reads as this test expects"
    command, _ = _quoted("+experiment=smoke rounds=200 plan=auto run_dir=runs/first")
    argv = [a for a in shlex.split(command)[1:] if not a.startswith("run_dir=")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "FLWR_TELEMETRY_ENABLED": "0"}
    res = _python([*argv, "progress=false", f"run_dir={tmp_path / 'first'}"], env=env, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in (tmp_path / "first" / "metrics.jsonl").read_text().splitlines()]
    losses = [row["test_loss"] for row in rows if "test_loss" in row]
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    privacy = json.loads((tmp_path / "first" / "privacy.json").read_text())
    lr = float(re.search(r"optimizer\.lr=([0-9.]+)", res.stderr).group(1))
    accuracy = rows[-1]["test_accuracy"]
    for got, want in zip((accuracy, losses[0], losses[-1]), readme.groups()):
        assert _agrees(str(got), want), (got, want)
    for got, want in zip((privacy["noise_multiplier"], lr, accuracy, losses[0], losses[-1]), planner.groups()):
        assert _agrees(str(got), want), (got, want)
