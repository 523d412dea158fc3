"""``sweep doctor SPACE.yaml | DATA``: audit a dataset as the trials would tokenize it."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from sweeper.cli._common import _prepare, _print
from sweeper.errors import SpaceError
from sweeper.space import TRIAL_KEYS, DatasetSpec, ModelSpec, load_space

#: ``max_seq_length`` values ``sweep doctor`` audits a bare dataset at when none is given: the usual range of QLoRA
#: fine-tuning of 7-8B models on one card.
DOCTOR_DEFAULT_LENGTHS = (512, 1024, 2048, 4096)
#: The largest ``--max-seq-length``: the bound the space file puts on ``max_seq_length``.
MAX_AUDIT_LENGTH = int(TRIAL_KEYS["max_seq_length"].high or 2**20)


def _compact_json(data: object) -> str:
    """Indented JSON with lists of numbers kept on one line (a finding's sample indices can run to thousands)."""
    text = json.dumps(data, indent=2)
    return re.sub(
        r"\[\s+(-?[\d.]+(?:,\s+-?[\d.]+)*)\s+\]", lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    """``sweep doctor SPACE.yaml | DATA``: audit the dataset as the trials would tokenize it; exit 1 with
    ``--strict`` when a finding would make a trial NaN."""
    from sweeper.audit import profile_data
    from sweeper.report import format_audit, format_file_rows, format_same_rows, format_untrained_rows

    dataset, model, lengths, dtypes, packing = _doctor_inputs(args)
    model_path, samples = _prepare(dataset, model)
    profile = profile_data(
        samples, dataset, model, model_path, lengths, audit=True, compute_dtypes=dtypes, special_tokens=True
    )
    report, tokenized = profile.report, profile.tokenized
    assert report is not None  # profiled with the audit
    longest = max((t.n_tokens for t in tokenized), default=None)
    same = format_same_rows(lengths, longest, packing)
    if args.json:
        _print(_compact_json(report.to_dict()))
    else:
        unused = sum(len(f.samples) for f in report.findings if f.kind == "dropped_row")
        rows = getattr(samples, "rows", 0)
        _print(
            f"sweep doctor: {dataset.path}, {report.samples} sample{'s' if report.samples != 1 else ''}"
            + (f" ({unused} of {rows} rows not trained on: dropped_row below)" if unused else "")
            + ", tokenized as the trials do with "
            f"{model.name_or_path}'s tokenizer" + (f" (vocabulary {report.vocab_size})" if report.vocab_size else "")
        )
        audit = format_audit(report)
        if profile.file.cut:  # the table is of the trials' sampled rows; the whole file's rows follow
            audit = audit.replace(
                "no finding would make a trial NaN at",
                f"in the trials' {profile.file.sampled} sampled rows, no finding would make a trial NaN at",
            )
        _print(audit)
        if profile.file.cut:  # the whole file's rows beyond the space's max_samples, which the exports train
            for line in format_untrained_rows(profile.file, lengths, f"sweep doctor {dataset.path}"):
                _print(line)
            if (whole := format_file_rows(profile.file)) is not None:
                _print(whole)
        if same:
            _print(same)
    return 1 if args.strict and report.nan_findings else 0


def _doctor_inputs(args: argparse.Namespace) -> tuple[DatasetSpec, ModelSpec, list[int], list[str], bool]:
    """What ``sweep doctor`` audits: ``(dataset, model, max_seq_lengths, compute_dtypes, packing)`` from a space
    file (its searched values, ``--model`` replacing its model) or from a bare dataset (every row, the default
    lengths and every compute dtype).

    Raises:
        SpaceError: A ``--max-seq-length`` out of range, an empty ``--model``, ``--set`` with a bare dataset, or a
            bad space file.
    """
    for n in args.max_seq_length or []:
        if n < 2 or n > MAX_AUDIT_LENGTH:
            raise SpaceError(
                f"--max-seq-length: {n} is out of range; give a number of tokens from 2 to "
                f"{MAX_AUDIT_LENGTH}, e.g. --max-seq-length 512 2048"
            )
    if args.model is not None and not args.model.strip():
        raise SpaceError("--model: empty; give a model directory, .gguf file, hub id or builtin:smollm2-135m-instruct")
    if Path(args.target).suffix.lower() in (".yaml", ".yml"):
        space = load_space(args.target, args.set)
        dataset = space.dataset
        model = (
            space.model
            if args.model is None
            else ModelSpec(name_or_path=args.model, trust_remote_code=space.model.trust_remote_code)
        )
        lengths = args.max_seq_length or space.values_of("max_seq_length")
        dtypes = [str(d) for d in space.values_of("bnb_4bit_compute_dtype")]
        packing = any(space.values_of("packing"))
    else:
        if args.set:
            raise SpaceError(
                f"--set: only a space file takes overrides, {args.target} is a dataset; give the "
                "space file, or leave --set out"
            )
        dataset = DatasetSpec(path=args.target, max_samples=10**9)  # a bare dataset: every row
        model = ModelSpec(name_or_path=args.model or ModelSpec().name_or_path)
        lengths = args.max_seq_length or list(DOCTOR_DEFAULT_LENGTHS)
        dtypes = list(TRIAL_KEYS["bnb_4bit_compute_dtype"].choices or ())
        packing = False
    return dataset, model, lengths, dtypes, packing
