"""Bad input, all of it, against a study that already holds a finished trial: each broken input gives exit 2 and
one line that names the file (or flag), the key and the fix, and leaves the study's database byte for byte as it
was."""

import hashlib

import pytest
import yaml

from sweeper.devices import cuda_visible
from sweeper.testing import run_cli, sweep, tiny_space, write_jsonl, write_space

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def existing(tiny_model, tmp_path_factory):
    """A folder holding study 'keep' with one finished trial, and the space that made it."""
    folder = tmp_path_factory.mktemp("bad-input")
    space = tiny_space(tiny_model, name="keep", n_trials=1)
    out = sweep("run", str(write_space(folder, space)), cwd=folder)
    assert out.returncode == 0, out.stderr
    return folder, space


def _with(space: dict, section: str, **values) -> dict:
    return {**space, section: {**space[section], **values}}


# (id, how to break the space or the command line, what the one line must contain)
CASES = [
    ("malformed-yaml", "RAW:study: {name: keep\nsearch: [", ["space.yaml", "line 2", "YAML syntax"]),
    ("wrong-type", lambda s: _with(s, "training", max_steps="many"), ["training.max_steps", "integer"]),
    ("empty-search", lambda s: {**s, "search": {}}, ["search: nothing to search"]),
    (
        "impossible-range",
        lambda s: {**s, "search": {"learning_rate": {"low": 1e-3, "high": 1e-5}}},
        ["search.learning_rate", "low"],
    ),
    ("missing-dataset", lambda s: _with(s, "dataset", path="missing.jsonl"), ["dataset.path", "no such file"]),
    (
        "missing-model",
        lambda s: _with(s, "model", name_or_path="./no/such/model"),
        ["model.name_or_path", "no such directory"],
    ),
    (
        "hub-model-no-network",
        lambda s: _with(s, "model", name_or_path="someorg/no-such-model"),
        ["model.name_or_path", "not in the Hugging Face cache", "huggingface-cli download someorg/no-such-model"],
    ),
    (
        "hub-dataset-no-network",
        lambda s: _with(s, "dataset", path="someorg/no-such-dataset"),
        ["dataset.path", "local"],
    ),
    ("no-usable-rows", lambda s: _with(s, "dataset", path="rows.jsonl"), ["rows.jsonl", "dataset"]),
    ("unknown-optimizer", lambda s: _with(s, "training", optim="adamw_bogus"), ["training.optim", "adamw_bogus"]),
    ("unknown-key", lambda s: _with(s, "training", lerning_rate=1e-4), ["training.lerning_rate", "did you mean"]),
    (
        "changed-search-values",
        lambda s: {**s, "search": {"r": [4, 8, 16]}},
        ["broken.yaml", "search.r", "choices 4, 8; now choices 4, 8, 16", "--study NAME"],
    ),
    (
        "changed-search-kind",
        lambda s: {**s, "search": {"r": {"low": 4, "high": 16, "step": 4}}},
        ["search.r", "a range 4 to 16", "--study NAME"],
    ),
    ("bad-workers", ["--workers", "0"], ["--workers: 0"]),
    ("bad-study-name", ["--study=-x"], ["--study", "it starts with '-'"]),
    ("long-study-name", ["--study", "a" * 300], ["--study", "300 characters long, over 100"]),
    ("study-name-is-a-file", ["--study", "my.db"], ["--study", "ends in .db", "drop the .db"]),
    ("every-reply-cut", ["--set", "dataset.path=cut.jsonl"], ["cut.jsonl: dataset: none of its 20 rows can train"]),
    ("long-data-name", ["--set", f"dataset.path={'d' * 300}.jsonl"], ["is too long for the file system", "255"]),
    ("long-storage-name", ["--storage", f"sqlite:///{'s' * 300}.db"], ["is too long for the file system", "255"]),
    ("bad-devices", ["--devices", "0,,0"], ["--devices", "--devices 0,1,2,3"]),
    ("bad-storage", ["--storage", "sqlite:////proc/no/such/dir/x.db"], ["study.storage", "--storage"]),
    (
        "same-name-other-storage",
        ["--storage", "sqlite:///elsewhere.db"],
        ["--storage", "studies/keep/", "studies/keep.db", "--study NAME"],
    ),
    ("storage-is-a-folder", ["--storage", "sqlite:///studies"], ["study.storage", "is a folder", ".db"]),
    ("storage-password-in-error", ["--storage", "postgresql://u:p@ss:s3cretPW@127.0.0.1:1/x"], ["--storage", "u:***@"]),
    ("in-memory-with-workers", ["--storage", "sqlite:///:memory:", "--workers", "2"], ["study.storage", "in-memory"]),
    ("in-memory", ["--storage", "sqlite://"], ["sqlite://: study.storage", "keeps nothing", "sqlite:///studies/"]),
    ("in-memory-bare", ["--storage", "sqlite:///"], ["study.storage", "in-memory"]),
    ("in-memory-uri", ["--storage", "sqlite:///file:x?mode=memory&uri=true"], ["study.storage", "in-memory"]),
    ("bad-heartbeat-env", {"SWEEPER_HEARTBEAT_INTERVAL_S": "0"}, ["SWEEPER_HEARTBEAT_INTERVAL_S", "e.g. 30"]),
    ("bad-progress-env", {"SWEEPER_PROGRESS_INTERVAL_S": "abc"}, ["SWEEPER_PROGRESS_INTERVAL_S", "'abc'", "e.g. 60"]),
    ("warmup-not-below-max-steps", ["--set", "warmup_steps=50"], ["--set: warmup_steps", "not below max_steps"]),
]

if not cuda_visible():  # a machine with a GPU has device 0
    CASES.append(("devices-without-gpu", ["--devices", "0"], ["--devices: 0: no GPU is visible", "leave --devices"]))


@pytest.mark.parametrize(("case", "breakage", "needles"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_the_study_untouched(existing, case, breakage, needles, monkeypatch):
    """In-process (:func:`sweeper.testing.run_cli`): the console script's exit code and streams are those of
    :func:`sweeper.cli.main`, which ``test_cli.py::test_bad_storage_is_one_line_without_password`` runs as a real
    process; a process of its own would import the model's libraries again for each case."""
    folder, space = existing
    db = folder / "studies" / "keep.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    write_jsonl(folder / "rows.jsonl", [{"text": ""}, {"messages": "not a list"}, {"other": 1}])
    write_jsonl(folder / "cut.jsonl", [{"prompt": "word " * 300 + f"{i}?", "completion": "yes"} for i in range(20)])
    path, argv = folder / "space.yaml", []
    if isinstance(breakage, str):
        path = folder / "broken.yaml"
        path.write_text(breakage.removeprefix("RAW:"))
        needles = [n.replace("space.yaml", "broken.yaml") for n in needles]
    elif callable(breakage):
        path = write_space(folder, breakage(yaml.safe_load((folder / "space.yaml").read_text())), "broken.yaml")
    elif isinstance(breakage, dict):
        for key, value in breakage.items():
            monkeypatch.setenv(key, value)
    else:
        argv = breakage
    out = run_cli("run", str(path), *argv, cwd=folder)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(lines) == 1 and all(n in lines[0] for n in needles), lines
    assert "; " in lines[0] and "Traceback" not in out.stderr and "s3cretPW" not in out.stderr  # what; the fix
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


@pytest.mark.parametrize("command", ["run", "trial", "doctor", "report", "export"])
def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path, command):
    out = run_cli(command, "n" * 300 + (".yaml" if command in ("run", "trial", "doctor") else ""), cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "too long" in lines[0] or "run 'sweep run SPACE.yaml' first" in lines[0], lines  # report: no such study
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_version_is_printed():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip().startswith("sweep ") and out.stdout.strip() != "sweep unknown"


def test_a_storage_in_a_folder_that_does_not_exist_is_refused_and_nothing_is_created(tmp_path, monkeypatch):
    import pytest

    from sweeper.errors import StudyError
    from sweeper.space import parse_space
    from sweeper.study._storage import open_study

    monkeypatch.chdir(tmp_path)
    space = parse_space({"study": {"name": "s"}, "search": {"r": [4, 8]}}, "space.yaml")
    missing = tmp_path / "no" / "such"
    with pytest.raises(StudyError, match="does not exist; create it") as info:
        open_study(space, f"sqlite:///{missing}/x.db")
    assert len(info.value.problems) == 1 and "--storage" in info.value.problems[0]
    assert not (tmp_path / "no").exists()
    open_study(space)  # the default studies/ is still created
    assert (tmp_path / "studies" / "s.db").is_file()


def test_reading_commands_name_which_storage_fault_it_is(tmp_path):
    """An unreachable server, a file that is not a database and a database without a study are three lines, each
    naming its cause; a password never shows."""
    (tmp_path / "garbage.db").write_text("garbage " * 100)
    (tmp_path / "empty.db").write_bytes(b"")
    cases = {
        "postgresql://u:s3cretPW@127.0.0.1:1/x": "cannot reach the database server",
        str(tmp_path / "garbage.db"): "not an SQLite database",
        str(tmp_path / "empty.db"): "holds no Optuna study",
    }
    lines = set()
    for ref, needle in cases.items():
        out = run_cli("report", ref, cwd=tmp_path)
        [line] = out.stderr.strip().splitlines()
        assert out.returncode == 2 and needle in line and "s3cretPW" not in line, line
        lines.add(line.split(": STUDY: ", 1)[1].split(" (")[0])
    assert len(lines) == 3
