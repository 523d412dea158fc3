"""The ``policy`` export (issues 58 and 67): the chosen configuration and the envelope the study measured around it,
frozen in a small Python module (standard library only at import; transformers, peft and torch inside the helpers that
build their objects), and a pytest guard beside it that turns red when a production config leaves that envelope.

The write-ups people follow after a QLoRA OOM end with a frozen policy and a pytest guard whose bounds are guesses
(``0 < max_seq_length <= 4096``); these bounds are what the study measured: the model, the quantization and the adapter
the trial ran, its effective batch, the longest rows that fit at its batch among the trials whose memory compares with
it (and what ran out above them), and the safe learning rate. The three files are real Python files of this package,
copied as they stand (:mod:`sweeper.export.policy_module` with the study's values as one literal,
:mod:`sweeper.export.policy_guard`, :mod:`sweeper.export.production`): linted and type-checked here, no program inside
a format string. The guard reads the production config the user names (``SWEEPER_PRODUCTION_CONFIG``) with the same
reader as ``sweep init --from``.
"""

from __future__ import annotations

import pprint
from importlib import resources
from typing import Any

from sweeper.export._dataset import ExportData
from sweeper.export._format import ExportFormat
from sweeper.export._settings import ExportSettings
from sweeper.stability import DEFAULT_HORIZON_STEPS

#: The environment variable naming the production config the guard checks.
PRODUCTION_ENV = "SWEEPER_PRODUCTION_CONFIG"

#: The marker lines of :mod:`sweeper.export.policy_module` between which the export writes the study's values.
VALUES_BEGIN = "# sweeper: values begin\n"
VALUES_END = "# sweeper: values end\n"


def _source(name: str) -> str:
    """The text of ``sweeper/export/<name>.py`` as the package holds it."""
    return resources.files("sweeper.export").joinpath(f"{name}.py").read_text(encoding="utf-8")


def policy_values(s: ExportSettings) -> dict[str, Any]:
    """The policy's values (:data:`sweeper.export.policy_module.VALUES`'s form) of the settings.

    Raises:
        ValueError: ``s`` has no envelope (settings made without a study).
    """
    if s.envelope is None:
        raise ValueError("a policy export needs the study's envelope")
    p, t, q, lora, e = s.provenance, s.training, s.quantization, s.lora, s.envelope
    done = p.confirmation
    exported = s.effective_batch_size
    confirmed = None
    if done is not None:
        confirmed = exported if done.as_exported else done.effective_batch_size or p.measured_effective_batch_size
    return {
        "model": s.model,
        "model_aliases": tuple(s.model_aliases),
        "load_in_4bit": True,
        "bnb_4bit_quant_type": q.bnb_4bit_quant_type,
        "bnb_4bit_use_double_quant": q.bnb_4bit_use_double_quant,
        "bnb_4bit_compute_dtype": q.bnb_4bit_compute_dtype,
        "r": lora.r,
        "lora_alpha": lora.lora_alpha,
        "lora_dropout": lora.lora_dropout,
        "target_modules": tuple(lora.target_modules),
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "learning_rate": t.learning_rate,
        "optim": t.optim,
        "gradient_checkpointing": t.gradient_checkpointing,
        "max_grad_norm": t.max_grad_norm,
        "max_seq_length": s.max_seq_length,
        "packing": s.collation.packing,
        "attn_implementation": s.collation.attn_implementation,
        "study": p.study,
        "trial": p.trial,
        "sweeper_version": dict(p.versions).get("sweeper"),
        "environment": dict(s.environment),
        "envelope": {
            "peak_memory_gib": p.peak_memory_gib,
            "memory_limit_gib": p.memory_limit_gib,
            "device": p.device,
            "largest_fit_max_seq_length": e.largest_fit_max_seq_length,
            "largest_fit_row_tokens": e.largest_fit_row_tokens,
            "fit_peak_memory_gib": e.fit_peak_memory_gib,
            "oom_above": e.oom_above,
            "predicted_max_lr": p.stability.predicted_max_lr,
            "safe_learning_rate": e.safe_learning_rate,
            "horizon_steps": p.stability.horizon_steps or DEFAULT_HORIZON_STEPS,
            "measured_effective_batch_size": p.measured_effective_batch_size,
            "confirmed_effective_batch_size": confirmed,
        },
    }


def render_policy(s: ExportSettings) -> tuple[str, str, str]:
    """The policy module's text (:mod:`sweeper.export.policy_module` with the study's values as its ``VALUES``
    literal, under a header of what was measured), its guard's (:mod:`sweeper.export.policy_guard`) and the
    production config reader's (:mod:`sweeper.export.production`), the last two as the package holds them.

    Raises:
        ValueError: ``s`` has no envelope (settings made without a study).
    """
    values = policy_values(s)
    module = _source("policy_module")
    begin, end = module.index(VALUES_BEGIN) + len(VALUES_BEGIN), module.index(VALUES_END)
    literal = "VALUES: dict[str, Any] = " + pprint.pformat(values, width=116, sort_dicts=False) + "\n"
    p = s.provenance
    head = [
        f"# The policy of study {p.study!r}, trial {p.trial}: written by 'sweep export --format policy' (sweeper "
        f"{dict(p.versions).get('sweeper')}, {p.exported}).",
        f"# Its guard is the file beside it with '_test' ({PRODUCTION_ENV}=PATH pytest ...); its values are sealed by "
        "the last line.",
    ]
    module = "\n".join(head) + "\n" + module[:begin] + literal + module[end:]
    return module, _source("policy_guard"), _source("production")


def _files(s: ExportSettings, data: ExportData | None) -> dict[str, str]:
    """The policy module (``.py``), its guard beside it (``_test.py``) and the reader the guard uses (``_read.py``)."""
    module, test, reader = render_policy(s)
    return {".py": module, "_test.py": test, "_read.py": reader}


POLICY = ExportFormat(
    name="policy",
    suffix=".py",
    help="the configuration and its measured envelope as a frozen Python policy, and a pytest guard beside it",
    render=_files,
    offered_instead=False,
)
