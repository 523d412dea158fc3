"""space.yaml: every key of the contract's example (docs/contract.md) loads into typed frozen
objects; each kind of mistake is one line
naming the file, the key and the fix; all problems are reported at once; every shipped space loads."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from sweeper.errors import SpaceError
from sweeper.space import TRIAL_KEYS, Categorical, TrialConfig, load_space, parse_duration_s, parse_space
from sweeper.space._overrides import apply_overrides
from sweeper.space._schema import OPTIMIZERS, Range

REPO = Path(__file__).resolve().parents[2]

CONTRACT_EXAMPLE = """
study:   {name: demo, n_trials: 12, timeout: 8h, sampler: tpe, seed: 0}
model:   {name_or_path: builtin:smollm2-135m-instruct, attn_implementation: sdpa, trust_remote_code: false}
dataset: {path: builtin:pydoc-topics, format: auto, max_samples: 512, seed: 0}
training:
  max_steps: 30
  learning_rate: 2.0e-4
  optim: paged_adamw_8bit
  gradient_checkpointing: true
  max_grad_norm: 1.0
  target_modules: [q_proj, k_proj, v_proj, o_proj]
  lora_dropout: 0.05
  memory_limit_gib: 24
  trial_timeout: 20m
  target_effective_batch_size: 16
search:
  r: [8, 16, 32, 64]
  lora_alpha_ratio: [0.5, 1, 2, 4]
  bnb_4bit_compute_dtype: [bfloat16, float16, float32]
  bnb_4bit_use_double_quant: [true, false]
  bnb_4bit_quant_type: [nf4, fp4]
  per_device_train_batch_size: [1, 2, 4, 8]
  max_seq_length: [512, 1024, 2048, 4096]
  weight_decay: {low: 0.0, high: 0.1}
"""


def test_spec_example_loads_typed_and_frozen():
    space = parse_space(yaml.safe_load(CONTRACT_EXAMPLE), "spec.yaml")
    assert space.study.timeout_s == 8 * 3600 and space.study.n_trials == 12
    assert space.search["r"] == Categorical(choices=(8, 16, 32, 64))
    assert space.search["weight_decay"] == Range(low=0.0, high=0.1)
    assert space.base.trial_timeout_s == 1200.0 and space.base.learning_rate == 2e-4
    config = space.trial_config({**space.first_choices(), "lora_alpha_ratio": 4})
    assert (
        config.lora_alpha == 32 and config.r == 8 and config.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.r = 4
    assert TrialConfig.from_dict(config.to_dict()) == config


def test_learning_rate_range_and_scalar_in_search():
    space = parse_space(
        {
            "search": {
                "learning_rate": {"low": 1e-5, "high": 1e-3, "log": True},
                "r": 16,
                "max_seq_length": {"low": 64, "high": 256, "step": 64},
            }
        }
    )
    assert space.search["learning_rate"] == Range(low=1e-5, high=1e-3, log=True)
    assert space.search["max_seq_length"].is_int and space.base.r == 16 and "r" not in space.search
    assert space.first_choices() == {"learning_rate": 1e-5, "max_seq_length": 64}


def test_trial_keys_match_trial_config_fields():
    fields = {f.name for f in dataclasses.fields(TrialConfig)} - {"model", "dataset"}
    assert fields == (set(TRIAL_KEYS) - {"trial_timeout"}) | {"trial_timeout_s"}


def test_the_memory_model_and_the_section_keys_derive_from_the_schema():
    from sweeper.memory._model import MEMORY_KEYS, MemorySettings
    from sweeper.space import DatasetSpec, ModelSpec, StudySpec
    from sweeper.space._values import _SECTION_KEYS

    config, memory = TrialConfig(), MemorySettings()
    for key in MEMORY_KEYS:
        assert getattr(memory, key) == getattr(config, key), key
    assert memory.attn_implementation == config.model.attn_implementation
    for name, cls in (("study", StudySpec), ("model", ModelSpec), ("dataset", DatasetSpec)):
        instance = cls()
        for key, spec in _SECTION_KEYS[name].items():
            attr = "timeout_s" if key == "timeout" else key
            assert getattr(instance, attr) == spec.default, (name, key)


def test_defaults_of_trial_keys_match_trial_config():
    config = TrialConfig()
    for key, spec in TRIAL_KEYS.items():
        attr = "trial_timeout_s" if key == "trial_timeout" else key
        assert getattr(config, attr) == spec.default, key


def test_optimizers_are_valid_transformers_names():
    from transformers.training_args import OptimizerNames

    valid = {o.value for o in OptimizerNames}
    assert set(OPTIMIZERS) <= valid, set(OPTIMIZERS) - valid


# Each kind of mistake: (yaml text, substrings the single line must contain).
BAD = [
    ("search:\n  lerning_rate: [1e-4]\n", ["search.lerning_rate", "unknown key", "did you mean 'learning_rate'"]),
    ("training:\n  max_step: 3\n", ["training.max_step", "did you mean 'max_steps'"]),
    ("studdy: {name: x}\n", ["studdy", "unknown section", "did you mean 'study'"]),
    ("study: {n_trials: 0}\n", ["study.n_trials", "0", "an integer >= 1"]),
    ("study: {sampler: cmaes}\n", ["study.sampler", "one of tpe, random, nsgaii"]),
    ("study: {timeout: soon}\n", ["study.timeout", "duration"]),
    ("search:\n  r: []\n", ["search.r", "empty list"]),
    ("search:\n  r: [8, 0]\n", ["search.r", "0 is not valid", ">= 1"]),
    ("search:\n  r: [8, 8]\n", ["search.r", "repeated"]),
    ("search:\n  bnb_4bit_compute_dtype: [bf16]\n", ["search.bnb_4bit_compute_dtype", "'bf16'", "bfloat16"]),
    ("search:\n  bnb_4bit_quant_type: {low: 1, high: 2}\n", ["search.bnb_4bit_quant_type", "numeric key"]),
    ("search:\n  learning_rate: {low: 1e-3, high: 1e-5}\n", ["search.learning_rate", "low <= high", "swap"]),
    ("search:\n  weight_decay: {low: 0.0, high: 0.1, log: true}\n", ["search.weight_decay", "low > 0"]),
    ("search:\n  learning_rate: {high: 1e-3}\n", ["search.learning_rate", "both low and high"]),
    ("search:\n  learning_rate: {low: 1e-5, hihg: 1e-3}\n", ["search.learning_rate.hihg", "did you mean 'high'"]),
    # two letters swapped: 'log', not difflib's closer-ranked 'low' (issue 55)
    (
        "search:\n  learning_rate: {low: 1e-5, high: 1e-3, lgo: true}\n",
        ["search.learning_rate.lgo", "did you mean 'log'"],
    ),
    ("search:\n  r: {low: 4, high: 64, step: 2.5}\n", ["search.r.step", "integer step"]),
    ("search:\n  memory_limit_gib: [8, 16]\n", ["search.memory_limit_gib", "cannot be searched", "training"]),
    ("training:\n  r: [8, 16]\n", ["training.r", "move 'r' to the search section"]),
    ("training:\n  r: 8\nsearch:\n  r: [8, 16]\n", ["search.r", "both training and search"]),
    ("training:\n  optim: adam\n", ["training.optim", "one of adamw_torch"]),
    ("training:\n  lora_dropout: 1.0\n", ["training.lora_dropout", "< 1"]),
    ("training:\n  trial_timeout: -5\n", ["training.trial_timeout", "duration"]),
    ("model: {attn_implementation: flash}\n", ["model.attn_implementation", "sdpa"]),
    ("dataset: {format: xml}\n", ["dataset.format", "sharegpt"]),
    ("search: [r, 8]\n", ["search", "expected a mapping"]),
    ("- a\n- b\n", ["(top level)", "expected a mapping"]),
    ("search:\n  r: [8\n", ["line", "YAML"]),
    ("search:\n  r: [8]\n  r: [16]\n", ["line 3", "'r' appears twice"]),
    ("[" * 5000 + "]" * 5000 + "\n", ["nested too deeply"]),
    ("search:\n  r: [1.0e+30]\n", ["search.r", "<= 4096"]),
    ("training:\n  memory_limit_gib: 1.0e+308\n", ["training.memory_limit_gib", "<= 65536"]),
    ("search:\n  learning_rate: {low: 1e-5, high: 1e-3, step: .inf}\n", ["search.learning_rate.step", "positive"]),
    ("search:\n  learning_rate: {low: 1e-5, high: 1e-3, step: .nan}\n", ["search.learning_rate.step", "positive"]),
    ("search:\n  r: {low: true, high: 8}\n", ["search.r", "not numbers"]),
    ("study: {timeout: 9999999999d}\n", ["study.timeout", "at most a year"]),
    ("study: {name: ../../escape}\n", ["study.name", "file name"]),
    ("training:\n  lr: 1e-4\n", ["training.lr", "did you mean 'learning_rate'"]),
    ("training:\n  lora_alpha: 32\n", ["training.lora_alpha", "lora_alpha = lora_alpha_ratio * r"]),
    ("", ["empty"]),
    ("study: {confirm_steps: 30}\n", ["study.confirm_steps", "30 is not longer than the trial's max_steps 30"]),
    ("study: {confirm_steps: 40}\nsearch:\n  max_steps: [20, 40]\n", ["study.confirm_steps", "max_steps 40"]),
    ("training: {warmup_steps: 30}\n", ["training.warmup_steps", "30 is not below max_steps 30", "e.g. 3"]),
    ("search:\n  warmup_steps: [0, 10]\ntraining: {max_steps: 10}\n", ["search.warmup_steps", "max_steps 10"]),
]


@pytest.mark.parametrize(("text", "needles"), BAD, ids=[b[1][0] for b in BAD])
def test_each_mistake_is_one_clear_line(tmp_path, text, needles):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError) as info:
        load_space(path)
    lines = info.value.problems
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{path}: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_all_problems_reported_at_once(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("study: {n_trials: -1}\ntraining: {max_step: 3}\nsearch:\n  r: []\n  lerning_rate: [1]\n")
    with pytest.raises(SpaceError) as info:
        load_space(path)
    assert len(info.value.problems) == 4


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(SpaceError, match="no such file"):
        load_space(tmp_path / "nope.yaml")
    with pytest.raises(SpaceError, match="is a directory"):
        load_space(tmp_path)


def test_sections_of_the_wrong_type_are_reported_with_overrides(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("study: 5\ntraining: [1]\nsearch: r\n")
    with pytest.raises(SpaceError) as info:
        load_space(path, ["r=8", "study.n_trials=2"])
    assert [p.split(": ")[1] for p in info.value.problems] == ["study", "training", "search"]


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("r==3", "--set: r: '=3' is not valid"),
        ("study.name=", "--set: study.name: empty value"),
        ("r=[4, 8]", "--set: r: training values are fixed; --set fixes one value"),
        ("lr=1e-3", "did you mean 'learning_rate'"),
        ("study.confirm_steps=1", "--set: study.confirm_steps: 1 is not longer than the trial's max_steps 30"),
    ],
)
def test_override_problems_are_blamed_on_set(tmp_path, item, needle):
    path = tmp_path / "space.yaml"
    path.write_text("search:\n  r: [8, 16]\n")
    with pytest.raises(SpaceError) as info:
        load_space(path, [item])
    assert len(info.value.problems) == 1 and needle in info.value.problems[0], info.value.problems


def test_overrides_fix_searched_keys_and_set_dotted_ones():
    raw = yaml.safe_load(CONTRACT_EXAMPLE)
    out, overridden = apply_overrides(
        raw, ["r=4", "learning_rate=1e-3", "study.n_trials=3", "dataset.max_samples=8", "target_modules=[q_proj]"]
    )
    space = parse_space(out)
    assert {"training.r", "study.n_trials", "dataset.max_samples"} <= overridden
    assert "r" not in space.search and space.base.r == 4 and space.base.learning_rate == 1e-3
    assert space.study.n_trials == 3 and space.dataset.max_samples == 8 and space.base.target_modules == ("q_proj",)
    assert raw["search"]["r"] == [8, 16, 32, 64]  # the input is not modified


@pytest.mark.parametrize(
    ("item", "needle"),
    [("rr=4", "did you mean 'r'"), ("r", "key=value"), ("model.name=x", "did you mean 'name_or_path'")],
)
def test_bad_overrides(item, needle):
    with pytest.raises(SpaceError, match=needle):
        apply_overrides({}, [item])


def test_a_key_set_twice_to_different_values_is_refused():
    for items in (["r=4", "r=8"], ["r=4", "training.r=8"], ["study.n_trials=3", "study.n_trials=5"]):
        with pytest.raises(SpaceError) as info:
            apply_overrides({}, items)
        [line] = info.value.problems
        assert "--set" in line and "set twice" in line and "once" in line, line
    out, _ = apply_overrides({}, ["r=4", "r=4"])  # the same value twice: nothing is ignored
    assert out["training"]["r"] == 4


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), (90, 90), ("90s", 90), ("20m", 1200), ("8h", 28800), ("1h30m", 5400), ("2d", 172800)],
)
def test_durations(text, seconds):
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("path", sorted((REPO / "search_spaces").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_spaces_load_and_open_with_their_command(path):
    space = load_space(path)
    assert space.search, "a shipped space searches something"
    first = path.read_text().splitlines()[0]
    assert first.startswith("# sweep run ") and path.name in first


@pytest.mark.parametrize(
    "name, why",
    [
        ("-x", "it starts with '-'"),
        ("...", "it starts with '.'"),
        ("a" * 300, "300 characters long"),
        ("my study", "' ' cannot be in a name"),
        ("ok.name_1-2", None),
    ],
)
def test_a_study_name_says_what_is_wrong_with_it(name, why):
    from sweeper.space import name_problem

    found = name_problem(name)
    assert (found is None) if why is None else (why in found), found
    if why is not None:
        with pytest.raises(SpaceError, match="study.name") as info:
            parse_space({"study": {"name": name}, "search": {"r": [4, 8]}}, "space.yaml")
        assert why in info.value.problems[0]


def test_the_doctor_command_audits_the_data_the_trials_read(tmp_path):
    from sweeper.space import load_space

    path = tmp_path / "base.yaml"
    path.write_text(
        yaml.safe_dump(
            {"study": {"name": "b"}, "dataset": {"path": "train.jsonl"}, "search": {"max_seq_length": [64, 128]}}
        )
    )
    assert load_space(path).doctor_command() == f"sweep doctor {path}"
    # --set moved the trials to other data: auditing base.yaml would audit train.jsonl, not what failed.
    other = load_space(path, ["dataset.path=allcut.jsonl"]).doctor_command()
    assert other.startswith(f"sweep doctor {Path.cwd() / 'allcut.jsonl'} --model ")
    assert other.endswith("--max-seq-length 64 128")


def test_a_relative_data_path_means_the_same_file_from_any_folder(tmp_path, monkeypatch):
    from sweeper.space import load_space

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "space.yaml").write_text(
        yaml.safe_dump({"study": {"name": "p"}, "dataset": {"path": "data/train.jsonl"}})
    )
    monkeypatch.chdir(elsewhere)
    space = load_space(project / "space.yaml")
    assert space.dataset.path == str(project / "data" / "train.jsonl")  # the file's folder, not the working one
    assert space.base.dataset.path == space.dataset.path  # what every trial stores and a confirmation reads
    typed = load_space(project / "space.yaml", ["dataset.path=mine.csv"])
    assert typed.dataset.path == str(elsewhere / "mine.csv")  # a command-line path is the working folder's
    for kept in ("builtin:pydoc-topics", "tatsu-lab/alpaca", "/abs/rows.jsonl"):
        assert load_space(project / "space.yaml", [f"dataset.path={kept}"]).dataset.path == kept


def test_a_step_written_1e_5_is_a_number_as_low_and_high_are(tmp_path):
    # YAML 1.1 (PyYAML) reads 1e-5, with no dot, as the string '1e-5'; low and high were read as numbers, step was
    # refused as "not a positive number" (issue 48)
    path = tmp_path / "space.yaml"
    path.write_text("search:\n  learning_rate: {low: 1e-5, high: 1e-3, step: 1e-5}\n")
    dim = load_space(path).search["learning_rate"]
    assert dim == Range(low=1e-5, high=1e-3, step=1e-5) and isinstance(dim.step, float)
    path.write_text("search:\n  learning_rate: {low: 1e-5, high: 1e-3, step: fast}\n")
    with pytest.raises(SpaceError) as bad:
        load_space(path)
    assert bad.value.problems == [
        f"{path}: search.learning_rate.step: 'fast' is not a positive number; give a positive step or drop it"
    ]
