"""A newcomer's mistakes (issue 32's table), each caught with one line that says what to do.

The first four are config mistakes: the real `dyngen` command in a fresh interpreter,
PREFECT_API_URL unset, must answer with exit code 2 within 2 s of CPU time, without ever
importing Prefect (so no server can have started).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from dyngen.cli import app
from tests.support import write

REPO = Path(__file__).resolve().parents[1]
GENERATOR = '''
    import datasets

    from dyngen import AbstractDataGenerator


    class HarderSums(AbstractDataGenerator):
        """Two new sums per round (the README's generator, shortened)."""

        defaults = {"rows": 2}

        def generate(self, dataset, context=None):
            rows = []
            for i in range(self.settings()["rows"]):
                a = len(dataset) * 10 + i
                rows.append({"data_source": "harder-sums", "ability": "math",
                             "prompt": [{"role": "user", "content": f"What is {a} + 1?"}],
                             "reward_model": {"style": "rule", "ground_truth": str(a + 1)},
                             "extra_info": {"index": a}})
            return datasets.Dataset.from_list(rows)


    class NoPrompt(AbstractDataGenerator):
        """Rows without the `prompt` column: every one fails the schema filter."""

        def generate(self, dataset, context=None):
            return datasets.Dataset.from_list([{"data_source": "x", "ability": "math",
                                                "reward_model": {"style": "rule",
                                                                 "ground_truth": "1"},
                                                "extra_info": {"index": 9}}])
'''
SEED = [{"data_source": "sums", "prompt": [{"role": "user", "content": f"What is {i} + 7?"}],
         "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + 7)},
         "extra_info": {"index": i}} for i in range(2)]
# Runs the CLI, then tells whether anything imported Prefect (a server needs it).
CLI_THEN_PREFECT = """
import sys
from dyngen.cli import app
try:
    app(sys.argv[1:], prog_name="dyngen")
except SystemExit as done:
    code = done.code
print("PREFECT IMPORTED" if "prefect" in sys.modules else "no prefect", file=sys.stderr)
sys.exit(code)
"""


@pytest.fixture
def newcomer(tmp_path: Path) -> Path:
    """A fresh folder as the README's quickstart leaves it: train.jsonl imported, a generator."""
    folder = tmp_path / "my-run"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SEED))
    write(folder / "harder_sums.py", GENERATOR)
    assert invoke(folder, "import", "my-data", str(folder / "train.jsonl")).exit_code == 0
    return folder


def invoke(folder: Path, *args: str) -> Result:
    env = {"DYNGEN_STORE_ROOT": str(folder / "dyngen_store"),
           "DYNGEN_LOG_DIR": str(folder / "logs")}
    cwd = Path.cwd()
    os.chdir(folder)  # the user's shell is in the folder, as the README says
    try:
        return CliRunner(env=env).invoke(app, list(args))
    finally:
        os.chdir(cwd)


def run_cli(folder: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The command in a fresh interpreter from `folder`; its result and its CPU seconds."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DYNGEN_STORE_ROOT": "dyngen_store"}
    env.pop("PREFECT_API_URL", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", CLI_THEN_PREFECT, *args], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"{' '.join(args)}: {wall:.2f} s wall, {cpu:.2f} s CPU")
    return done, cpu


def assert_caught_early(done: subprocess.CompletedProcess[str], cpu: float,
                        *wanted: str, budget: float = 2.0) -> str:
    """Exit 2, one `error:` line holding `wanted`, no traceback, Prefect never imported."""
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1] == "no prefect", done.stderr  # no flow run, no temporary server
    message = lines[0]
    assert message.startswith("error: ") and len(lines) == 2, done.stderr
    for text in wanted:
        assert text in message, message
    assert "Traceback" not in done.stderr
    # The work itself, CPU time so a loaded machine does not decide; before this check, a
    # temporary server started first (10+ s).
    assert cpu < budget, f"{cpu:.2f} s of CPU before the message"
    return message


ROUND = ("round", "my-data", "--step", "1")
# The user's generator module imports `datasets`, ~1.2 s of CPU on its own on a loaded CI
# machine (0.6 s on a quiet laptop): checking such a class may take that much longer.
IMPORTS_DATASETS = 3.0


def test_a_missing_generator_file_is_named_with_the_file_that_is_there(newcomer: Path) -> None:
    done, cpu = run_cli(newcomer, *ROUND, "data.datagen.path=harder_sum.py",
                        "data.datagen.name=HarderSums")
    assert_caught_early(done, cpu, "data.datagen.path='harder_sum.py'", "does not exist",
                        "Did you mean harder_sums.py?")


def test_a_class_name_typo_suggests_the_class(newcomer: Path) -> None:
    done, cpu = run_cli(newcomer, *ROUND, "data.datagen.path=harder_sums.py",
                        "data.datagen.name=HarderSum")
    assert_caught_early(done, cpu, "no attribute 'HarderSum'", "Did you mean 'HarderSums'?",
                        budget=IMPORTS_DATASETS)


def test_a_misspelt_name_key_names_the_key_it_meant(newcomer: Path) -> None:
    done, cpu = run_cli(newcomer, *ROUND, "data.datagen.path=harder_sums.py",
                        "data.datagen.nmae=HarderSums")
    message = assert_caught_early(done, cpu, "data.datagen.nmae",
                                  "Did you mean data.datagen.name=HarderSums?")
    assert "MockDataGenerator" not in message


def test_a_generator_key_typo_is_caught_before_any_flow_run(newcomer: Path) -> None:
    done, cpu = run_cli(newcomer, *ROUND, "data.datagen.path=harder_sums.py",
                        "data.datagen.name=HarderSums", "data.datagen.rowz=3")
    assert_caught_early(done, cpu, "unknown keys ['rowz'] for HarderSums",
                        "Did you mean data.datagen.rows?", budget=IMPORTS_DATASETS)


@pytest.mark.usefixtures("prefect_server")
def test_a_round_that_keeps_nothing_warns_and_a_repeat_says_how_to_run_another(
        newcomer: Path) -> None:
    args = [*ROUND, "data.datagen.path=harder_sums.py", "data.datagen.name=NoPrompt"]
    first = invoke(newcomer, *args)
    assert first.exit_code == 0, first.output  # nothing failed
    assert "kept 0 of 1" in first.stdout
    warning = " ".join(first.stderr.split())
    assert warning.startswith("warning: version 1 of 'my-data' kept none of the 1 generated")
    assert "schema (1): " in warning and "prompt" in warning.split("schema (1): ")[1]
    assert "dyngen show my-data --rejected" in warning
    shown = invoke(newcomer, "show", "my-data", "--rejected")
    assert shown.exit_code == 0 and "schema" in shown.stdout

    again = invoke(newcomer, *ROUND, "data.datagen.path=harder_sums.py",
                   "data.datagen.name=HarderSums")
    assert again.exit_code == 0, again.output
    said = " ".join(again.stdout.split())
    assert "already committed as version 1 by trigger my-data:step:1; nothing new" in said
    assert "--step 2" in said and "--event-id" in said
    another = invoke(newcomer, "round", "my-data", "--step", "2",
                     "data.datagen.path=harder_sums.py", "data.datagen.name=HarderSums")
    assert "committed 'my-data' version 2" in another.stdout, another.output


@pytest.mark.usefixtures("prefect_server")
def test_a_round_failing_at_run_time_names_its_stage_and_its_log(newcomer: Path) -> None:
    write(newcomer / "crashing.py", '''
        from dyngen import AbstractDataGenerator


        class Crashing(AbstractDataGenerator):
            def generate(self, dataset, context=None):
                raise RuntimeError("proposer crashed: CUDA error (simulated)")
    ''')
    done = invoke(newcomer, *ROUND, "data.datagen.path=crashing.py",
                  "data.datagen.name=Crashing", "round.retries=0")
    assert done.exit_code == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    message = " ".join(" ".join(lines).split())
    assert message.startswith("error: the round of 'my-data' failed in its generate stage: "
                              "RuntimeError: proposer crashed: CUDA error (simulated)"), message
    assert "Traceback" not in done.output
    log = Path(message.split("full log: ")[1].split()[0].rstrip("."))
    assert log.is_file() and "proposer crashed" in log.read_text()


def test_global_options_work_after_the_command(newcomer: Path, tmp_path: Path) -> None:
    root = str(newcomer / "dyngen_store")
    for args in (["log", "my-data", "--root", root], ["log", "--root", root, "my-data"],
                 ["log", "my-data", f"--root={root}", "--debug"]):
        done = CliRunner(env={"DYNGEN_STORE_ROOT": str(tmp_path / "elsewhere")}).invoke(
            app, args)
        assert done.exit_code == 0, (args, done.output)
        assert "my-data" in done.stdout
    debug = CliRunner().invoke(app, ["log", "nope", "--root", root, "--debug"])
    assert debug.exit_code == 2 and "Traceback" in debug.stderr


def test_a_dataset_name_typo_suggests_the_dataset(newcomer: Path) -> None:
    done = invoke(newcomer, "log", "my-dta")
    assert done.exit_code == 2
    assert "did you mean 'my-data'?" in " ".join(done.stderr.split())


def test_a_command_typo_suggests_the_command() -> None:
    done = CliRunner().invoke(app, ["lgo", "my-data"])
    assert done.exit_code == 2
    assert "Did you mean 'log'?" in " ".join(done.output.split())


def test_a_filter_class_typo_suggests_the_filter(newcomer: Path) -> None:
    write(newcomer / "my_filters.py", '''
        from dyngen import RowFilter


        class ShortOnly(RowFilter):
            def check(self, rows):
                return [None for _ in rows]
    ''')
    done = invoke(newcomer, *ROUND,
                  "round.filters=[{path: my_filters.py, name: ShortOnyl}]")
    assert done.exit_code == 2
    message = " ".join(done.stderr.split())
    assert "round.filters[0].name" in message and "Did you mean 'ShortOnly'?" in message


def test_a_malformed_jsonl_line_is_named_by_its_line_number(tmp_path: Path) -> None:
    bad = tmp_path / "train.jsonl"
    bad.write_text(json.dumps(SEED[0]) + "\n" + '{"data_source": "sums",}\n')
    done = CliRunner().invoke(app, ["--root", str(tmp_path / "store"), "import", "d", str(bad)])
    assert done.exit_code == 2
    message = " ".join(done.stderr.split())
    assert f"input file {bad}: line 2 is not valid JSON" in message, message
    assert "row 1" not in message and ". in" not in message


def test_log_fits_an_80_column_terminal_and_wide_shows_every_column(newcomer: Path) -> None:
    from dyngen.store import Store

    store = Store(newcomer / "dyngen_store")
    store.append("my-data", SEED[:1], generator="HarderSums", round_id="round-1",
                 rejected=[{"reason": "duplicate", "detail": "same prompt as row 0",
                            "row": json.dumps(SEED[1])}],
                 lineage={"generator": {"class": "harder_sums.HarderSums"},
                          "trigger": {"event_id": "evt-0123456789", "step": 12},
                          "counts": {"generated": 2, "kept": 1, "rejected": {"duplicate": 1}},
                          "flow_run_id": "run-9876543210"})
    env = {"COLUMNS": "80", "DYNGEN_STORE_ROOT": str(store.root)}
    narrow = CliRunner(env=env).invoke(app, ["log", "my-data"])
    assert narrow.exit_code == 0, narrow.output
    lines = narrow.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in narrow.stdout, narrow.stdout
    row = next(line for line in lines if "HarderSums" in line)
    for cell in ("3 (+1)", "12", "1/2"):
        assert cell in row, row
    assert "duplicate 1" in narrow.stdout
    wide = CliRunner(env=env).invoke(app, ["log", "my-data", "--wide"])
    assert wide.exit_code == 0 and "run" in wide.stdout and "parent" in wide.stdout


def test_help_prints_at_once_without_importing_the_heavy_parts() -> None:
    probe = ("import sys, time; t = time.perf_counter(); import dyngen.cli; "
             "print(time.perf_counter() - t); "
             "print(sorted(m for m in ('prefect', 'datasets', 'pyarrow', 'omegaconf', "
             "'dyngen.store.store') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert out[1] == "[]", out  # each command imports what it needs when it runs
    def cpu_of(argv: list[str]) -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert done.returncode == 0, done.stderr
        # CPU time, which a loaded machine inflates less than the wall clock.
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    # The floor any typer app's help pays: Python, typer and its rich help formatter.
    floor = [sys.executable, "-c", "import typer.rich_utils"]
    help_, base = float("inf"), float("inf")
    for _ in range(3):  # best of three, alternately, so the machine's load hits both alike
        help_ = min(help_, cpu_of([sys.executable, "-m", "dyngen.cli", "--help"]))
        base = min(base, cpu_of(floor))
    print(f"dyngen --help: {help_:.2f} s CPU (typer's floor {base:.2f} s; import dyngen.cli "
          f"{float(out[0]):.2f} s wall)")
    # 0.5 s on a quiet machine; on a loaded one, dyngen's own share over typer's floor.
    assert help_ < 0.5 or help_ - base < 0.25, f"dyngen --help took {help_:.2f} s of CPU"
