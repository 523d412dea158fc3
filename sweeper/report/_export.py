"""From a study to a production config: pick a trial of the front and write its settings for transformers/peft,
TRL, axolotl or LLaMA-Factory (``sweep export``).

The export carries the trial's quantization, LoRA and batch settings as measured, and keeps the space's
``target_effective_batch_size`` through ``gradient_accumulation_steps`` (the short trials ran with their own). A
setting the target tool cannot express the way the trial ran it is said in a comment, never dropped silently.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import optuna

from sweeper.errors import StudyError
from sweeper.report._console import format_instability
from sweeper.study import StoredTrial, TrialStatus, by_knee_distance, pareto_front, stored_trials

Pick = Literal["knee", "min-memory", "most-stable"]
Format = Literal["hf", "trl", "axolotl", "llama-factory", "json"]
FORMATS: tuple[str, ...] = ("hf", "trl", "axolotl", "llama-factory", "json")
PICKS: tuple[str, ...] = ("knee", "min-memory", "most-stable")

#: Built-in models as the hub ids a production run would load.
HUB_IDS = {"builtin:smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def _objectives(trial: StoredTrial) -> tuple[float, float]:
    """``(peak_memory_gib, instability)`` of a COMPLETE trial (the front and the exported trials are)."""
    if trial.values is None:
        raise StudyError(f"trial {trial.number} did not complete: it has no objective values")
    return trial.values


def knee(front: Sequence[StoredTrial]) -> StoredTrial:
    """The front's point of best trade-off: after scaling each objective to [0, 1] over the front (min-max), the
    point nearest the ideal point (0, 0) in Euclidean distance, the "compromise solution" of multi-objective
    decision making (Zeleny 1973; Deb, *Multi-Objective Optimization using Evolutionary Algorithms*, 2001, 8.2).
    Ties go to the lower instability, then the lower memory.

    Raises:
        ValueError: ``front`` is empty.
    """
    if not front:
        raise ValueError("the front is empty")
    return by_knee_distance(front)[0]


#: What LLaMA-Factory computes a 4-bit model in: it has no key for the compute dtype and derives it from ``bf16`` /
#: ``fp16`` (LLaMA-Factory 0.9.5, ``hparams/parser.py``), or with neither from the GPU and the checkpoint's dtype
#: (``extras/misc.py: infer_optim_dtype``).
LLAMA_FACTORY_DTYPES = (
    "LLaMA-Factory has no key for the 4-bit compute dtype: bf16: true computes in bfloat16 (a GPU with bfloat16 "
    "support, Ampere or newer), fp16: true in float16; with neither it picks bfloat16 on a GPU with bfloat16 support "
    "when the checkpoint is bfloat16 or names no dtype, float16 on other GPUs and for a float16 or float32 checkpoint "
    "(a local float16 conversion included), float32 only without a GPU"
)


def inexpressible(trial: StoredTrial, fmt: str) -> str | None:
    """Why ``fmt`` cannot train ``trial`` as it ran, or None when it can: LLaMA-Factory has no float32 compute dtype
    on a GPU (see :data:`LLAMA_FACTORY_DTYPES`); axolotl's ``lora_alpha`` is an int (axolotl 0.21's schema rejects
    a fractional one, as ``lora_alpha_ratio * r`` can be). The other formats express every trial."""
    dtype = trial.config.bnb_4bit_compute_dtype if trial.config is not None else None
    if fmt == "llama-factory" and dtype == "float32":
        return (
            "it computed in float32, which LLaMA-Factory cannot express (it computes a 4-bit model in bfloat16 or "
            "float16 on a GPU)"
        )
    alpha = trial.lora_alpha
    if fmt == "axolotl" and alpha is not None and not float(alpha).is_integer():
        return (
            f"its lora_alpha {alpha} (lora_alpha_ratio * r) is not a whole number, which axolotl cannot express (its "
            "lora_alpha is an integer)"
        )
    return None


#: What each format that cannot express some trials says when it can express none: why, and how to get one it can.
_NONE_EXPRESSIBLE = {
    "llama-factory": (
        "every one computed in float32, which LLaMA-Factory cannot express",
        "run trials with bnb_4bit_compute_dtype bfloat16 or float16",
    ),
    "axolotl": (
        "every one has a fractional lora_alpha, which axolotl cannot express",
        "run trials whose lora_alpha_ratio * r is a whole number",
    ),
}


def _formats_expressing(trial: StoredTrial, fmt: str) -> str:
    """The formats other than ``fmt`` that express ``trial``, as ``hf, trl or axolotl``."""
    others = [f for f in FORMATS if f not in (fmt, "json") and inexpressible(trial, f) is None]
    return others[0] if len(others) == 1 else ", ".join(others[:-1]) + " or " + others[-1]


def _non_dominated(trials: Sequence[StoredTrial]) -> list[StoredTrial]:
    """The trials no other of ``trials`` beats on both objectives (lower is better), by peak memory."""
    front = []
    for t in trials:
        a = _objectives(t)
        beaten = any(
            (b := _objectives(u))[0] <= a[0] and b[1] <= a[1] and b != a for u in trials if u.number != t.number
        )
        if not beaten:
            front.append(t)
    return sorted(front, key=_objectives)


def _expressible_trials(study: optuna.Study, fmt: str) -> list[StoredTrial]:
    """The measured COMPLETE trials ``fmt`` can express whose confirmation did not fail."""
    return [
        t
        for t in stored_trials(study)
        if t.status == TrialStatus.COMPLETE
        and t.values is not None
        and not t.is_repeat
        and (t.confirmation is None or t.confirmation.passed)
        and inexpressible(t, fmt) is None
    ]


def nearest_expressible(study: optuna.Study, trial: StoredTrial, fmt: str) -> StoredTrial | None:
    """The trial ``fmt`` can express nearest ``trial``: the fewest settings changed (the same configuration in
    another compute dtype first), then the nearest objectives (each scaled to [0, 1] over the candidates); None when
    ``fmt`` can express no complete trial."""
    candidates = _expressible_trials(study, fmt)
    if not candidates:
        return None
    values = [_objectives(t) for t in candidates] + [_objectives(trial)]
    lows = [min(v[i] for v in values) for i in range(2)]
    spans = [(max(v[i] for v in values) - lows[i]) or 1.0 for i in range(2)]
    mine = trial.config.to_dict() if trial.config is not None else {}

    def key(t: StoredTrial) -> tuple[int, float, int]:
        theirs = t.config.to_dict() if t.config is not None else {}
        changed = sum(1 for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        a, b = _objectives(trial), _objectives(t)
        distance = math.hypot(*((a[i] - b[i]) / spans[i] for i in range(2)))
        return (changed, round(distance, 12), t.number)

    return min(candidates, key=key)


def pick_trial(
    study: optuna.Study, *, number: int | None = None, pick: Pick = "knee", fmt: str | None = None
) -> StoredTrial:
    """The trial to export: trial ``number``, or the front's ``knee``, ``min-memory`` or ``most-stable`` point.

    A pick prefers confirmed trials: when some trials of the front completed their confirmation (``sweep confirm``),
    the pick is made among those; a trial that failed its confirmation is never picked nor exported. With ``fmt``, a
    pick is made on the front of the trials that format can express (:func:`inexpressible`: LLaMA-Factory has no
    float32 compute, axolotl no fractional ``lora_alpha``), and trial ``number`` is refused when the format cannot
    express it, naming the nearest trial it can (:func:`nearest_expressible`).

    Raises:
        StudyError: No such trial, the trial did not complete or failed its confirmation (its status and reason are
            named), the format cannot express it, or the study has no complete trial (that the format can express)
            that did not fail its confirmation.
    """
    name = study.study_name
    if number is not None:
        trials = {t.number: t for t in stored_trials(study)}
        if number not in trials:
            raise StudyError(
                f"{name}: --trial: no trial {number} in this study (trials 0-{len(trials) - 1}); "
                "see 'sweep report " + name + "'"
            )
        t = trials[number]
        if t.repeat_of is not None:  # a repeat reused an earlier trial's result: that one was measured
            t = trials[t.repeat_of]
        if t.status != TrialStatus.COMPLETE or t.values is None:
            reason = t.user_attrs.get("reason", "no result")
            raise StudyError(
                f"{name}: --trial: trial {number} did not complete ({t.status_name}: {reason}); export a "
                "complete trial, e.g. --pick knee"
            )
        _refuse_failed_confirmation(name, t, "--trial")
        if fmt is not None and (why := inexpressible(t, fmt)) is not None:
            raise StudyError(f"{name}: --format {fmt}: trial {number}: {why}; " + _instead(study, t, fmt))
        return t
    front = pareto_front(study)
    if not front:
        raise StudyError(f"{name}: --pick: the study has no complete trial to export; run more trials with 'sweep run'")
    if fmt is not None and any(inexpressible(t, fmt) for t in front):
        expressible = _non_dominated(_expressible_trials(study, fmt))
        if not expressible:
            why, fix = _NONE_EXPRESSIBLE[fmt]
            raise StudyError(
                f"{name}: --format {fmt}: no complete trial of the study can be expressed in it ({why}); export "
                f"with --format {_formats_expressing(front[0], fmt)}, or {fix}"
            )
        front = expressible
    passed = [t for t in front if t.confirmation is not None and t.confirmation.passed]
    usable = [t for t in front if t.confirmation is None or t.confirmation.passed]
    if not usable:
        _refuse_failed_confirmation(name, front[0], "--pick")
    front = passed or usable
    if pick == "min-memory":
        return min(front, key=lambda t: (_objectives(t)[0], _objectives(t)[1]))
    if pick == "most-stable":
        return min(front, key=lambda t: (_objectives(t)[1], _objectives(t)[0]))
    return knee(front)


def _instead(study: optuna.Study, trial: StoredTrial, fmt: str) -> str:
    """The fix for a trial ``fmt`` cannot express: the nearest trial it can, or the formats that express it."""
    near = nearest_expressible(study, trial, fmt)
    formats = _formats_expressing(trial, fmt)
    if near is None:
        return f"no complete trial of the study can be; export with --format {formats}"
    peak, instability = _objectives(near)
    dtype = near.config.bnb_4bit_compute_dtype if near.config is not None else "?"
    return (
        f"the nearest trial it can express is {near.number} ({dtype}, peak {peak:.3f} GiB, instability "
        f"{format_instability(instability)}): --trial {near.number}; or export trial {trial.number} with --format "
        f"{formats}"
    )


def _refuse_failed_confirmation(study_name: str, trial: StoredTrial, flag: str) -> None:
    """Raise when ``trial``'s long run failed: its short result does not hold at the horizon of a real run."""
    done = trial.confirmation
    if done is None or done.passed:
        return
    where = f" at step {done.fail_step}" if done.fail_step is not None else ""
    raise StudyError(
        f"{study_name}: {flag}: trial {trial.number} failed its confirmation ({done.status}{where} of {done.steps} "
        f"steps: {done.reason}); export a trial whose long run completed, or confirm another with 'sweep confirm "
        f"{study_name} --front'"
    )


@dataclass(frozen=True, kw_only=True)
class ExportSettings:
    """What an export writes, gathered from the trial's stored config.

    Attributes:
        model: Model to fine-tune (a built-in name becomes its hub id).
        quantization: ``BitsAndBytesConfig`` keyword arguments (``bnb_4bit_compute_dtype`` as a dtype name).
        lora: ``LoraConfig`` keyword arguments.
        training: ``TrainingArguments`` keyword arguments, ``gradient_accumulation_steps`` set to keep
            ``target_effective_batch_size``.
        max_seq_length: Tokens per row.
        effective_batch_size: ``per_device_train_batch_size * gradient_accumulation_steps`` of the export.
        target_effective_batch_size: What the space asked for.
        provenance: Study, trial, measured peak memory and its kind, instability, library versions.
        notes: Comments every format carries (how the trial differs from a production run).
    """

    model: str
    quantization: dict[str, Any]
    lora: dict[str, Any]
    training: dict[str, Any]
    max_seq_length: int
    effective_batch_size: int
    target_effective_batch_size: int
    provenance: dict[str, Any]
    notes: list[str]


def settings_of(study: optuna.Study, trial: StoredTrial) -> ExportSettings:
    """The export settings of a complete trial (see :class:`ExportSettings`).

    Raises:
        StudyError: The trial lacks the config sweeper stores (a study not made by ``sweep run``, or edited).
    """
    try:
        return _settings_of(study, trial)
    except (KeyError, TypeError, ValueError) as exc:
        raise StudyError(
            f"{study.study_name}: --trial: trial {trial.number} has no usable sweeper config "
            f"(missing or bad {exc}); export a trial that 'sweep run' measured"
        ) from None


def _settings_of(study: optuna.Study, trial: StoredTrial) -> ExportSettings:
    c = trial.config
    if c is None or trial.values is None:
        raise KeyError("config")
    batch = c.per_device_train_batch_size
    target = c.target_effective_batch_size
    accumulation = max(1, math.ceil(target / batch))
    notes = [
        f"gradient_accumulation_steps={accumulation} keeps target_effective_batch_size={target} at "
        f"per_device_train_batch_size={batch} (the short trial ran gradient_accumulation_steps="
        f"{c.gradient_accumulation_steps})",
        f"the trial ran {c.max_steps} steps at a constant learning rate after {c.warmup_steps} "
        "warmup steps, to probe the peak rate; choose the schedule of the real run yourself",
        "the trial supervised the assistant replies only (prompt tokens had label -100)",
        "add your dataset, its chat template and the length of the run (steps or epochs): a trial does not choose them",
    ]
    if batch * accumulation != target:
        notes.append(f"{target} is not a multiple of {batch}: the effective batch is {batch * accumulation}")
    done = trial.confirmation
    if done is None:
        notes.append(
            f"not confirmed at a long horizon: its instability comes from {c.max_steps} steps; run 'sweep confirm "
            f"{study.study_name} --trials {trial.number}' to run it {10 * c.max_steps} steps first"
        )
    else:
        notes.append(
            f"confirmed: a {done.steps}-step run of this configuration completed (instability "
            f"{done.instability if done.instability is None else round(done.instability, 4)}, peak "
            f"{done.peak_memory_gib if done.peak_memory_gib is None else round(done.peak_memory_gib, 3)} GiB)"
        )
    name = c.model.name_or_path
    local = study.user_attrs.get("model_path")
    if local and (name.startswith("builtin:") or name.lower().endswith(".gguf")):
        notes.append(
            f"the trials loaded {name} from its local conversion {local}; point the model name there to "
            "train without the hub"
        )
    versions = trial.result.versions or {}
    peak = trial.result.peak_memory_gib
    provenance = {
        "study": study.study_name,
        "trial": trial.number,
        "peak_memory_gib": round(peak, 3) if isinstance(peak, float) else peak,
        "memory_kind": trial.result.memory_kind,
        "memory_limit_gib": c.memory_limit_gib,
        "instability": round(_objectives(trial)[1], 4),
        "confirmation": trial.confirmation.to_dict() if trial.confirmation else None,
        "device": trial.result.device,
        "versions": {**versions, "sweeper": _version("sweeper")},
        "exported": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    training = {
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": accumulation,
        "learning_rate": c.learning_rate,
        "optim": c.optim,
        "gradient_checkpointing": c.gradient_checkpointing,
        "max_grad_norm": c.max_grad_norm,
        "warmup_steps": c.warmup_steps,
        "weight_decay": c.weight_decay,
        "bf16": c.bnb_4bit_compute_dtype == "bfloat16",
        "fp16": c.bnb_4bit_compute_dtype == "float16",
        "seed": c.seed,
    }
    return ExportSettings(
        model=HUB_IDS.get(name, name),
        quantization={
            "load_in_4bit": True,
            "bnb_4bit_quant_type": c.bnb_4bit_quant_type,
            "bnb_4bit_use_double_quant": c.bnb_4bit_use_double_quant,
            "bnb_4bit_compute_dtype": c.bnb_4bit_compute_dtype,
        },
        lora={
            "r": c.r,
            "lora_alpha": trial.lora_alpha,
            "lora_dropout": c.lora_dropout,
            "target_modules": list(c.target_modules),
            "bias": "none",
            "task_type": "CAUSAL_LM",
        },
        training=training,
        max_seq_length=c.max_seq_length,
        effective_batch_size=batch * accumulation,
        target_effective_batch_size=target,
        provenance=provenance,
        notes=notes,
    )


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _header(s: ExportSettings, comment: str) -> list[str]:
    p = s.provenance
    versions = ", ".join(f"{k} {v}" for k, v in p["versions"].items() if v)
    lines = [
        f"Exported by sweeper from study '{p['study']}', trial {p['trial']} ({p['exported']}).",
        f"Measured: peak memory {p['peak_memory_gib']} GiB ({p['memory_kind']}, cap {p['memory_limit_gib']} GiB), "
        f"instability {p['instability']}, on {p['device']}.",
        f"Versions: {versions}.",
        *s.notes,
    ]
    return [f"{comment} {line}" for line in lines]


def _py_value(value: Any) -> str:
    return repr(value)


#: ``TrainingArguments`` keys the ``.py`` exports write by another name: transformers 5.23 renamed
#: ``gradient_checkpointing`` to ``activation_checkpointing`` (the old name warns there and goes in v6), while the
#: production stacks pin older releases (axolotl 0.21: 5.20.1, LLaMA-Factory 0.9.5: at most 5.6.0). The file asks
#: the installed transformers which name it has.
_CHECKPOINTING_LINES = [
    "# transformers 5.23 renamed gradient_checkpointing to activation_checkpointing (the old name warns there and is",
    "# removed in v6); older releases, such as axolotl's 5.20 and LLaMA-Factory's 5.6, know only the old name.",
    'CHECKPOINTING = "activation_checkpointing"',
    "if CHECKPOINTING not in {0}.__dataclass_fields__:",
    '    CHECKPOINTING = "gradient_checkpointing"',
]

_TRL_HELPERS = '''

def chat_template_masks_assistant(tokenizer):
    """Whether TRL can mask the assistant turns itself with this tokenizer's chat template (assistant_only_loss):
    the template has {% generation %} markers, or TRL ships a training version of it (Qwen3, Llama 3, ...)."""
    import re

    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if re.search(r"\\{%-?\\s*generation\\s*-?%\\}", template or ""):
        return True
    try:
        from trl.chat_template_utils import get_training_chat_template
    except ImportError:  # a TRL without training templates
        return False
    try:
        get_training_chat_template(tokenizer)
    except ValueError:  # "The chat template is not training-compatible ..."
        return False
    return True


#: ShareGPT's speakers as chat roles, as the trial read them (sweeper.data.ROLE_ALIASES).
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
         "tool": "tool", "observation": "tool"}


def _text(content):
    """A turn's content as the trial read it: text, a number's digits, or OpenAI-style text parts joined; None for
    what the trial did not train on (null, an image part, a mapping)."""
    if isinstance(content, str):
        return content
    if isinstance(content, (int, float)) and not isinstance(content, bool):
        return str(content)
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None


def _turns(row):
    """A row's conversation as role/content turns, as the trial read it (OpenAI "messages" or ShareGPT
    "conversations" from/value, and a top-level "system"), or None for a row the trial left out: a speaker it does
    not know, content that is not text, a tool call, no assistant turn."""
    import json

    raw = row.get("messages") if row.get("messages") is not None else row.get("conversations")
    if isinstance(raw, str):  # a CSV cell or a column saved as JSON text
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, list) or not raw:
        return None
    turns = []
    for m in raw:
        if not isinstance(m, dict) or m.get("tool_calls") or m.get("function_call"):
            return None
        role = m.get("role") if m.get("role") is not None else m.get("from")
        text = _text(m.get("content") if m.get("content") is not None else m.get("value"))
        name = str(role).strip().lower()
        if role is None or name not in ROLES or text is None:
            return None
        turns.append({"role": ROLES[name], "content": text})
    system = row.get("system")
    if isinstance(system, str) and system.strip() and turns[0]["role"] != "system":
        turns.insert(0, {"role": "system", "content": system})
    return turns if any(t["role"] == "assistant" for t in turns) else None


def _kind(row):
    """A row's own format from the fields it has, as the trial tells it (sweeper.data.detect_format)."""
    has = {k for k, v in row.items() if v is not None}
    if "conversations" in has or "messages" in has:
        return "messages"
    if {"instruction", "output"} <= has:
        return "alpaca"
    if {"prompt", "completion"} <= has:
        return "prompt_completion"
    return "text" if "text" in has else None


def _fields(row, keys, optional=()):
    """The fields as text, as the trial read them, or None for a row it left out: a field that is not text, every
    field empty, or a null one."""
    values = {}
    for key in (*keys, *optional):
        value = row.get(key)
        values[key] = None if value is None or isinstance(value, list) else _text(value)
        if value is not None and values[key] is None:  # not text (a list, a mapping, a boolean)
            return None
    if not any(str(values[k] or "").strip() for k in keys) or any(values[k] is None for k in keys):
        return None
    return [values[k] or "" for k in (*keys, *optional)]


def _row(row, kind, masks):
    """One row as TRL rows of the trial's supervision, or None for a row the trial left out."""
    if kind == "messages":
        turns = _turns(row)
        if turns is None:
            return None
        if masks:
            return [{"messages": turns}]
        return [{"prompt": turns[:i], "completion": [t]} for i, t in enumerate(turns) if t["role"] == "assistant"]
    if kind == "prompt_completion" and (isinstance(row.get("prompt"), list) or isinstance(row.get("completion"), list)):
        prompt, completion = row.get("prompt"), row.get("completion")  # TRL's conversational prompt/completion
        if not isinstance(prompt, list) or not isinstance(completion, list) or not completion:
            return None
        turns = _turns({"messages": [*prompt, *completion], "system": row.get("system")})
        if turns is None:
            return None
        cut = len(turns) - len(completion)
        if any(t["role"] == "assistant" for t in turns[:cut]) or any(t["role"] != "assistant" for t in turns[cut:]):
            return None
        return [{"prompt": turns[:cut], "completion": turns[cut:]}]
    if kind in ("prompt_completion", "alpaca"):
        got = _fields(row, ("prompt", "completion")) if kind == "prompt_completion" else _fields(
            row, ("instruction", "output"), ("input",))
        if got is None:
            return None
        prompt, reply = got[0], got[1]
        if kind == "alpaca" and got[2].strip():
            prompt += f"\\n\\n{got[2]}"
        return [{"prompt": [{"role": "user", "content": prompt}],
                 "completion": [{"role": "assistant", "content": reply}]}]
    got = _fields(row, ("text",))
    return None if got is None else [{"text": got[0]}]  # TRL appends the end-of-sequence token, as the trial does


def trl_dataset(rows, tokenizer):
    """The rows (chat "messages" or ShareGPT "conversations", alpaca instruction/input/output, prompt/completion or
    text) as TRL trains them the way the trial did, and the SFTConfig keys that go with them.

    The trial supervised every assistant reply with its end-of-turn token, the completion of prompt/completion and
    alpaca rows (rendered as a user and an assistant turn), and all of a text row. Where the chat template lets TRL
    mask assistant turns, a conversation stays one row (assistant_only_loss); otherwise each assistant reply becomes
    a prompt/completion row (the conversation up to it, then the reply) and TRL masks the prompt
    (completion_only_loss), which supervises the same tokens. As the trial, it reads the format most rows have and
    leaves out, and counts, the rows of another format and those the trial left out."""
    from collections import Counter

    from datasets import Dataset

    rows = list(rows)
    masks = chat_template_masks_assistant(tokenizer)
    counts = Counter(k for k in map(_kind, rows) if k is not None)
    order = ["messages", "alpaca", "prompt_completion", "text"]
    kind = max(counts, key=lambda k: (counts[k], -order.index(k))) if counts else "text"
    out, left_out = [], 0
    for row in rows:
        own = _kind(row)
        got = None if own not in (None, kind) else _row(row, kind, masks)
        if got is None:
            left_out += 1
        else:
            out += got
    if left_out:
        print(f"trl_dataset: {left_out} of {len(rows)} rows left out, as the trial left them out (another format "
              "than most rows', a speaker, content or tool call it does not read, no reply, a null or empty field); "
              "'sweep doctor' lists them")
    loss = {"messages": {"assistant_only_loss": True}, "prompt_completion": {"completion_only_loss": True}}
    if kind == "messages" and not masks or kind == "alpaca":
        kind = "prompt_completion"
    return Dataset.from_list(out), loss.get(kind, {})


def build_trainer(model, tokenizer, rows, **overrides):
    """An SFTTrainer for the model loaded with bnb_config (see below), training the LoRA of lora_config on rows
    (any format of trl_dataset) with training_args; overrides replace SFTConfig keys (max_steps, output_dir, ...)."""
    import torch

    if tokenizer.chat_template is None:
        tokenizer.chat_template = TRIAL_CHAT_TEMPLATE  # the template the trials used for this tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # as the trial did
    dataset, loss = trl_dataset(rows, tokenizer)
    args = make_sft_config(**{**loss, **overrides})
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=lora_config)
    # TRL casts the LoRA weights of a 4-bit model to bfloat16; the trial trained them in float32 (peft's default).
    for param in trainer.model.parameters():
        if param.requires_grad:
            param.data = param.data.to(torch.float32)
    return trainer
'''


def render_hf(s: ExportSettings, *, trl: bool = False) -> str:
    """A Python file building ``BitsAndBytesConfig``, ``LoraConfig`` and ``TrainingArguments`` from the settings
    (``hf``), or TRL's ``SFTConfig`` and a ``build_trainer(model, tokenizer, rows)`` that builds the ``SFTTrainer``
    (``trl``); importing it builds the config objects, nothing is loaded or trained.

    It runs on every transformers 5 release (the checkpointing key's name is asked of the installed one). The
    ``trl`` file chooses at run time how TRL supervises what the trial supervised: ``assistant_only_loss`` where the
    tokenizer's chat template lets TRL mask assistant turns, else each reply as a prompt/completion row
    (``completion_only_loss``), the template's end-of-turn token included either way.
    """
    from sweeper.data import DEFAULT_CHAT_TEMPLATE

    q = dict(s.quantization)
    dtype = q.pop("bnb_4bit_compute_dtype")
    args_class = "SFTConfig" if trl else "TrainingArguments"
    lines = ['"""QLoRA settings chosen with sweeper."""', "", *_header(s, "#"), ""]
    lines += [
        "import torch",
        "from peft import LoraConfig",
        "from transformers import BitsAndBytesConfig" + ("" if trl else ", TrainingArguments"),
    ]
    if trl:
        lines.append("from trl import SFTConfig, SFTTrainer")
    lines += [
        "",
        f"MODEL_NAME = {s.model!r}",
        f"MAX_SEQ_LENGTH = {s.max_seq_length}",
    ]
    if trl:
        lines += [
            "# The chat template the trials applied when the tokenizer has none (build_trainer sets it then).",
            f"TRIAL_CHAT_TEMPLATE = {DEFAULT_CHAT_TEMPLATE!r}",
        ]
    lines += ["", *[line.format(args_class) for line in _CHECKPOINTING_LINES], "", "bnb_config = BitsAndBytesConfig("]
    lines += [f"    {k}={_py_value(v)}," for k, v in q.items()]
    lines += [f"    bnb_4bit_compute_dtype=torch.{dtype},", ")", "", "lora_config = LoraConfig("]
    lines += [f"    {k}={_py_value(v)}," for k, v in s.lora.items()]
    lines.append(")")
    lines.append("")
    if trl:
        lines += ["", "def make_sft_config(**overrides):", '    """training_args with some keys replaced."""']
        lines.append("    settings = dict(")
        indent = "        "
    else:
        lines.append(f"training_args = {args_class}(")
        indent = "    "
    out_dir = "outputs/" + str(s.provenance["study"]) + "-trial" + str(s.provenance["trial"])
    lines.append(f"{indent}output_dir={out_dir!r},")
    for k, v in s.training.items():
        if k != "gradient_checkpointing":
            lines.append(f"{indent}{k}={_py_value(v)},")
    lines.append(f"{indent}use_cpu=not torch.cuda.is_available(),  # so that the file also loads without a GPU")
    if trl:
        lines += [
            f"{indent}max_length=MAX_SEQ_LENGTH,  # TRL's name for max_seq_length",
            f'{indent}truncation_mode="keep_start",  # longer rows are cut at the end, as the trial cut them',
            f"{indent}packing=False,  # one sample a row, as in the trial",
            "    )",
            f"    settings[CHECKPOINTING] = {_py_value(s.training['gradient_checkpointing'])}",
            f"    return {args_class}(**{{**settings, **overrides}})",
            "",
            "",
            "training_args = make_sft_config()",
        ]
        lines += _TRL_HELPERS.rstrip("\n").split("\n")
        lines += [
            "",
            "",
            "# Train with: tokenizer = AutoTokenizer.from_pretrained(MODEL_NAME); model = AutoModelForCausalLM."
            "from_pretrained(",
            "#     MODEL_NAME, quantization_config=bnb_config, dtype=bnb_config.bnb_4bit_compute_dtype)",
            "# build_trainer(model, tokenizer, rows).train()  # rows: your dataset, e.g. datasets.load_dataset(...)",
        ]
    else:
        lines += [
            f"    **{{CHECKPOINTING: {_py_value(s.training['gradient_checkpointing'])}}},",
            ")",
            "",
            "# Load the model with: AutoModelForCausalLM.from_pretrained(MODEL_NAME, "
            "quantization_config=bnb_config, dtype=bnb_config.bnb_4bit_compute_dtype)",
            "# Tokenize as the trial did: one sample a row (no packing), cut to MAX_SEQ_LENGTH tokens at its end.",
        ]
    return "\n".join(lines) + "\n"


def settings_json(s: ExportSettings) -> dict[str, Any]:
    """The settings as JSON: ``{"provenance", "notes", "model", "max_seq_length", "bnb_config", "lora_config",
    "training_args", "effective_batch_size", "target_effective_batch_size"}``."""
    return {
        "provenance": s.provenance,
        "notes": s.notes,
        "model": s.model,
        "max_seq_length": s.max_seq_length,
        "bnb_config": s.quantization,
        "lora_config": s.lora,
        "training_args": s.training,
        "effective_batch_size": s.effective_batch_size,
        "target_effective_batch_size": s.target_effective_batch_size,
    }


def _yaml(header: list[str], data: Mapping[str, Any], comments: Mapping[str, str]) -> str:
    """YAML of ``data`` in order, with the header comment and a comment after the keys named in ``comments``."""
    import yaml

    lines = list(header) + [""]
    for key, value in data.items():
        if isinstance(value, (list, dict)):  # one line: [q_proj, v_proj], {bnb_4bit_quant_type: nf4, ...}
            text = f"{key}: " + yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
        else:
            text = yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False, width=1000).rstrip("\n")
        if key in comments:
            first, *rest = text.split("\n")
            text = "\n".join([f"{first}  # {comments[key]}", *rest])
        lines.append(text)
    return "\n".join(lines) + "\n"


def _same_named_training(t: Mapping[str, Any]) -> dict[str, Any]:
    """The ``TrainingArguments`` keys axolotl and LLaMA-Factory both spell as transformers does."""
    return {k: t[k] for k in ("max_grad_norm", "warmup_steps", "weight_decay", "bf16", "fp16", "seed")}


#: axolotl's fused LoRA kernels (its ``lora_optims``), which it switches on by default for QLoRA: written as off,
#: since the trial ran peft's own layers.
AXOLOTL_LORA_KERNELS = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")


def render_axolotl(s: ExportSettings) -> str:
    """An axolotl config (``adapter: qlora``), in the keys of axolotl 0.21's schema. axolotl derives
    ``bnb_4bit_compute_dtype`` from its ``bf16``/``fp16`` flags; the trial's value is passed through
    ``bnb_config_kwargs``, which axolotl merges into its ``BitsAndBytesConfig``. Two of axolotl's defaults would
    train otherwise than the trial: ``tf32: auto`` turns TF32 matmuls on for Ampere and newer GPUs (the trial ran
    PyTorch's default, full float32 matmuls), and ``excess_length_strategy`` defaults to ``drop`` for rows longer
    than ``sequence_len`` (the trial truncated them): both are written out, and so are axolotl's fused LoRA kernels
    (:data:`AXOLOTL_LORA_KERNELS`), as off.

    Raises:
        StudyError: The trial's ``lora_alpha`` is not a whole number (axolotl's is an integer: :func:`inexpressible`).
    """
    t, q = s.training, s.quantization
    alpha = s.lora["lora_alpha"]
    if not float(alpha).is_integer():
        raise StudyError(
            f"{s.provenance['study']}: --format axolotl: trial {s.provenance['trial']} has lora_alpha {alpha}, not a "
            "whole number, which axolotl cannot express (its lora_alpha is an integer); export it with --format hf, "
            "trl or llama-factory"
        )
    data = {
        "base_model": s.model,
        "load_in_4bit": True,
        "adapter": "qlora",
        "lora_r": s.lora["r"],
        "lora_alpha": s.lora["lora_alpha"],
        "lora_dropout": s.lora["lora_dropout"],
        "lora_target_modules": s.lora["target_modules"],
        "bnb_config_kwargs": {
            "bnb_4bit_quant_type": q["bnb_4bit_quant_type"],
            "bnb_4bit_use_double_quant": q["bnb_4bit_use_double_quant"],
            "bnb_4bit_compute_dtype": q["bnb_4bit_compute_dtype"],
        },
        "sequence_len": s.max_seq_length,
        "excess_length_strategy": "truncate",
        "sample_packing": False,
        "micro_batch_size": t["per_device_train_batch_size"],
        "gradient_accumulation_steps": t["gradient_accumulation_steps"],
        "learning_rate": t["learning_rate"],
        "optimizer": t["optim"],
        "gradient_checkpointing": t["gradient_checkpointing"],
        **_same_named_training(t),
        "tf32": False,
        **dict.fromkeys(AXOLOTL_LORA_KERNELS, False),
        "output_dir": f"./outputs/{s.provenance['study']}-trial{s.provenance['trial']}",
    }
    comments = {
        "bnb_config_kwargs": "axolotl ties bnb_4bit_compute_dtype to bf16/fp16; this entry sets the trial's value "
        "explicitly",
        "sequence_len": "sweeper's max_seq_length",
        "excess_length_strategy": "longer rows are cut to sequence_len, as the trial cut them (axolotl's default, "
        "drop, would leave them out)",
        "sample_packing": "one sample a row, as in the trial",
        "micro_batch_size": "per_device_train_batch_size",
        "tf32": "the trial ran float32 matmuls in full float32 (PyTorch's default); axolotl's default, auto, turns "
        "TF32 on for Ampere and newer GPUs",
        AXOLOTL_LORA_KERNELS[0]: "the trial ran peft's own LoRA layers; axolotl turns its fused LoRA kernels on by "
        "default for QLoRA, whose memory and (with lora_dropout) numerics are not what the sweep measured",
    }
    if not t["bf16"] and not t["fp16"]:
        comments["bf16"] = "the trial computed in float32: no mixed precision (axolotl's default, auto, would use bf16)"
    return _yaml(_header(s, "#"), data, comments)


def render_llama_factory(s: ExportSettings) -> str:
    """A LLaMA-Factory training config (``finetuning_type: lora``, ``quantization_bit: 4``). LLaMA-Factory derives
    the 4-bit compute dtype from ``bf16``/``fp16`` and has no key for it (see :data:`LLAMA_FACTORY_DTYPES`): the
    comment states what it computes in. A float32 trial cannot be expressed (:func:`inexpressible`).

    Raises:
        StudyError: The trial computed in float32.
    """
    t, q = s.training, s.quantization
    dtype = q["bnb_4bit_compute_dtype"]
    if dtype == "float32":
        raise StudyError(
            f"{s.provenance['study']}: --format llama-factory: trial {s.provenance['trial']} computed in float32, "
            "which LLaMA-Factory cannot express; export it with --format hf, trl or axolotl"
        )
    data = {
        "model_name_or_path": s.model,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "quantization_bit": 4,
        "quantization_type": q["bnb_4bit_quant_type"],
        "double_quantization": q["bnb_4bit_use_double_quant"],
        "lora_rank": s.lora["r"],
        "lora_alpha": s.lora["lora_alpha"],
        "lora_dropout": s.lora["lora_dropout"],
        "lora_target": ",".join(s.lora["target_modules"]),
        "cutoff_len": s.max_seq_length,
        "per_device_train_batch_size": t["per_device_train_batch_size"],
        "gradient_accumulation_steps": t["gradient_accumulation_steps"],
        "learning_rate": t["learning_rate"],
        "optim": t["optim"],
        "disable_gradient_checkpointing": not t["gradient_checkpointing"],
        **_same_named_training(t),
        "output_dir": f"outputs/{s.provenance['study']}-trial{s.provenance['trial']}",
    }
    effective = (
        "bfloat16, as the trial (needs a GPU with bfloat16 support: Ampere or newer)"
        if dtype == "bfloat16"
        else "float16, as the trial, on any GPU and whatever the checkpoint's dtype"
    )
    comments = {
        "quantization_bit": "bitsandbytes: LLaMA-Factory's default quantization_method",
        "quantization_type": "bnb_4bit_quant_type",
        "double_quantization": "bnb_4bit_use_double_quant",
        "cutoff_len": "sweeper's max_seq_length. A longer row is fitted by cutting its prompt and its reply each "
        "in part (LLaMA-Factory's infer_seqlen), where the trial cut the row's end: such rows train other tokens than "
        "in the trial ('sweep doctor' lists them as truncated)",
        "bf16" if dtype == "bfloat16" else "fp16": f"LLaMA-Factory computes the 4-bit layers in {effective}",
    }
    header = _header(s, "#") + [f"# {LLAMA_FACTORY_DTYPES}"]
    return _yaml(header, data, comments)


def render(s: ExportSettings, fmt: Format) -> dict[str, str]:
    """The files of one export: ``{suffix: text}`` (``hf`` writes ``.py`` and ``.json``, the others one file)."""
    if fmt == "hf":
        return {".py": render_hf(s), ".json": json.dumps(settings_json(s), indent=2) + "\n"}
    if fmt == "trl":
        return {".py": render_hf(s, trl=True)}
    if fmt == "axolotl":
        return {".yaml": render_axolotl(s)}
    if fmt == "llama-factory":
        return {".yaml": render_llama_factory(s)}
    return {".json": json.dumps(settings_json(s), indent=2) + "\n"}


#: The suffix of each format's main file.
SUFFIXES = {"hf": ".py", "trl": ".py", "axolotl": ".yaml", "llama-factory": ".yaml", "json": ".json"}


def export_path(path: str | Path, fmt: Format, default_name: str) -> Path:
    """Where ``-o PATH`` puts an export: PATH itself (its suffix must be the format's, or none: then it is added);
    inside PATH when it is a folder or ends with ``/``, as ``default_name``.

    Raises:
        StudyError: PATH has another suffix (``.txt`` for a YAML export).
    """
    suffix = SUFFIXES[fmt]
    text = str(path)
    base = Path(path)
    if text.endswith(("/", os.sep)) or base.is_dir() or base.name in ("", ".", ".."):
        return base / (default_name + suffix)
    if base.suffix and base.suffix.lower() not in (suffix, ".yml" if suffix == ".yaml" else suffix):
        raise StudyError(
            f"{path}: -o: the {fmt} export is a {suffix} file; give a path ending in {suffix}, or a folder"
        )
    return base if base.suffix else base.with_name(base.name + suffix)


def write_export(study: optuna.Study, trial: StoredTrial, fmt: Format, path: str | Path) -> list[Path]:
    """Write the export of ``trial`` in ``fmt`` to ``path`` (see :func:`export_path`; ``hf`` also writes the JSON
    beside the ``.py``). Each file is written to a temporary name and renamed, so an existing export is never left
    half-written.

    Returns:
        The files written.

    Raises:
        StudyError: The path has the wrong suffix, or the folder cannot be written.
    """
    files = render(settings_of(study, trial), fmt)
    base = export_path(path, fmt, f"trial{trial.number}-{fmt}")
    out = []
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for suffix, text in files.items():
            target = base if suffix == SUFFIXES[fmt] else base.with_suffix(suffix)
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, target)
            out.append(target)
    except OSError as exc:
        raise StudyError(f"{base}: -o: cannot write the export ({exc.strerror}); choose a writable path") from None
    return out
