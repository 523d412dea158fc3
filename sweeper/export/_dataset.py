"""The dataset entry of the ``axolotl`` and ``llama-factory`` exports: the trial's rows written beside the export as
the trial read them (:class:`TrialRows`), and the tool's keys that render them through the same chat template with
the loss on the same tokens.

Why the rows are written rather than the source file named: the trial reads five formats and normalizes what the
tools read otherwise (ShareGPT's speaker names, a top-level ``system`` column, alpaca's ``instruction`` and
``input`` joined by a blank line where LLaMA-Factory joins them by a newline, prompt/completion rows that axolotl has
no chat-template type for, the built-in corpus that is no file at all). As chat turns (``role``/``content``) every
tool reads them one way, checked in LLaMA-Factory 0.9.5's and axolotl 0.21.0's own dataset loaders
(``tests/export/test_export_tools.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.data import (
    DEFAULT_CHAT_TEMPLATE,
    describe_dropped,
    eos_appended,
    load_samples,
    load_tokenizer,
    unused_rows,
)
from sweeper.errors import DataError, ModelError
from sweeper.space import TrialConfig

#: The file name of the rows, inside the export's data folder (:func:`data_folder`).
ROWS_FILE = "rows.jsonl"

#: LLaMA-Factory's dataset registry, read from ``dataset_dir``.
LLAMA_FACTORY_INFO = "dataset_info.json"


@dataclass(frozen=True)
class TrialRows:
    """The rows a trial of the study trains on, from the whole dataset (not cut to ``dataset.max_samples``), in the
    file's order, as JSON lines: ``{"messages": [{"role", "content"}, ...]}`` (roles ``system``/``user``/
    ``assistant``/``tool``) or ``{"text": ...}``.

    Attributes:
        source: ``dataset.path`` as the study ran it.
        kind: ``messages`` or ``text``.
        lines: One JSON object a row.
        n_source_rows: Rows in the source (what the trials could draw from).
        left_out: The rows the trial does not train on (unreadable, refused by the chat template), described
            (:func:`sweeper.data.describe_dropped`), or ``""``.
        n_left_out: How many.
        max_samples: The trials' ``dataset.max_samples`` (they drew that many rows, seeded).
        chat_template: The tokenizer's own chat template is rendered (True), sweeper's ChatML
            (:data:`sweeper.data.DEFAULT_CHAT_TEMPLATE`, the tokenizer has none: False), or the tokenizer could not
            be loaded here (None).
        eos_after_completion: The trial ends each reply of a prompt/completion or alpaca row with the tokenizer's
            end-of-sequence token, which the chat template's end of turn is not (a tool reading chat turns does not
            add it).
        not_alternating: Rows whose turns are not system (optional), then user and assistant in turn, ending with
            the assistant: LLaMA-Factory's ``sharegpt`` reader skips them, the trial trains them.
    """

    source: str
    kind: str
    lines: tuple[str, ...]
    n_source_rows: int
    left_out: str
    n_left_out: int
    max_samples: int
    chat_template: bool | None
    eos_after_completion: bool
    not_alternating: int

    @property
    def text(self) -> str:
        """The JSON-lines file."""
        return "".join(line + "\n" for line in self.lines)

    def summary(self) -> str:
        """One sentence: where the rows come from and which were left out."""
        rows = f"{len(self.lines)} rows of {self.source}"
        out = (
            f"; {self.n_left_out} of its {self.n_source_rows} rows left out, as the trial left them out "
            f"({self.left_out})"
            if self.n_left_out
            else ""
        )
        return (
            f"the dataset: {rows}, as the trial read them ({self.kind}){out}; the trials drew "
            f"{min(self.max_samples, len(self.lines))} of them (dataset.max_samples {self.max_samples}); "
            f"{ROWS_FILE} sha256 {self.sha256}"
        )

    @property
    def sha256(self) -> str:
        """The digest of :attr:`text` as written: an export names it, so that a later export can tell a rows file
        it wrote (replaced freely) from one edited since (kept without ``--force``)."""
        return hashlib.sha256(self.text.encode()).hexdigest()


def trial_rows(config: TrialConfig, model_path: str | None) -> TrialRows:
    """The rows the trials of ``config`` train on (:class:`TrialRows`), read from the whole dataset.

    Args:
        config: The trial's stored config (its ``dataset`` and ``model``).
        model_path: The folder the trials loaded the model from (a built-in model's local conversion), or None for
            ``config.model.name_or_path``.

    Raises:
        DataError: The dataset cannot be read here (moved, deleted, a hub id not in the cache): one line.
    """
    spec = dataclasses.replace(config.dataset, max_samples=10**9)
    samples = load_samples(spec)
    tokenizer = _tokenizer(model_path or config.model.name_or_path, config.model.trust_remote_code)
    dropped = unused_rows(samples, tokenizer) if tokenizer is not None else list(samples.dropped)
    refused = {d.index for d in dropped}
    kept = sorted((s for s in samples if s.index not in refused), key=lambda s: s.index)
    if not kept:
        raise DataError(f"{config.dataset.path}: dataset: no row the trial trains on ({describe_dropped(dropped)})")
    kind = "text" if kept[0].text is not None else "messages"
    lines = tuple(
        json.dumps({"text": s.text} if s.text is not None else {"messages": [dict(m) for m in s.messages or ()]})
        for s in kept
    )
    return TrialRows(
        source=config.dataset.path,
        kind=kind,
        lines=lines,
        n_source_rows=samples.rows,
        left_out=describe_dropped(dropped) if dropped else "",
        n_left_out=len(dropped),
        max_samples=config.dataset.max_samples,
        chat_template=None if tokenizer is None else bool(tokenizer.chat_template),
        eos_after_completion=tokenizer is not None and _eos_after_completion(kept, tokenizer),
        not_alternating=sum(not _alternates(s.messages) for s in kept if s.messages is not None),
    )


def _tokenizer(path: str, trust_remote_code: bool) -> Any:
    """The trials' tokenizer, or None when it cannot be loaded here (a checkpoint moved since the sweep)."""
    try:
        return load_tokenizer(path, trust_remote_code=trust_remote_code)
    except ModelError:
        return None


def _eos_after_completion(samples: list[Any], tokenizer: Any) -> bool:
    """Whether the trial appends the end-of-sequence token after a completion's reply (the chat template's end of
    turn is not that token): checked on the first completion sample."""
    first = next((s for s in samples if s.completion), None)
    return first is not None and eos_appended(first, tokenizer)


def _alternates(messages: Any) -> bool:
    """LLaMA-Factory's ``sharegpt`` rule (``data/converter.py``): an optional first system turn, then user and
    assistant turns in turn (a tool's output in a user's place), an even count."""
    turns = [m["role"] for m in messages]
    if turns and turns[0] == "system":
        turns = turns[1:]
    expected = (("user", "tool"), ("assistant",))
    return len(turns) % 2 == 0 and all(role in expected[i % 2] for i, role in enumerate(turns))


@dataclass(frozen=True)
class ExportData:
    """The dataset part of an axolotl or LLaMA-Factory export.

    Attributes:
        folder: Where the rows go (:func:`data_folder`).
        rows: The trial's rows, or None when they cannot be read here.
        error: Why not (the one-line :class:`~sweeper.errors.DataError`), or None.
    """

    folder: Path
    rows: TrialRows | None
    error: str | None = None

    def missing_note(self) -> str:
        """The comment of an export whose rows could not be read."""
        return (
            f"no dataset entry: the trial's rows could not be read here ({self.error}); add the dataset yourself, "
            "rendered through the model's chat template with the loss on the assistant replies and their end of turn"
        )

    def rows_file(self) -> dict[str, str]:
        """``{path: text}`` of the rows file in :attr:`folder` (``rows.jsonl``), ``{}`` when the rows cannot be
        read: what a format's ``render`` returns for it."""
        return {str(self.folder / ROWS_FILE): self.rows.text} if self.rows else {}


def export_data(config: TrialConfig, model_path: str | None, export: Path) -> ExportData:
    """:class:`ExportData` for the export at ``export`` (its main file): the rows, or why they cannot be read."""
    try:
        return ExportData(data_folder(export), trial_rows(config, model_path))
    except DataError as exc:
        return ExportData(data_folder(export), None, str(exc))


def data_folder(export: Path) -> Path:
    """The folder beside an export's main file that holds its rows (and LLaMA-Factory's registry):
    ``trial1-axolotl.yaml`` -> ``trial1-axolotl.data/``, as an absolute path (the tools resolve relative paths
    against the folder they are started in)."""
    return export.resolve().with_suffix(".data")


def axolotl_dataset(rows: TrialRows, folder: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """axolotl 0.21's keys for the rows (``datasets`` and the chat template), and their comments.

    Chat rows: ``type: chat_template`` over ``messages`` with the loss on the assistant turns and their end of turn
    (``roles_to_train: [assistant]``, ``train_on_eos: turn``); the tokenizer's own template
    (``chat_template: tokenizer_default``), or sweeper's ChatML as ``chat_template_jinja`` when it has none. Text rows:
    ``type: completion`` (every token supervised).
    """
    path = str(folder / ROWS_FILE)
    if rows.kind == "text":
        text_entry = {"path": path, "ds_type": "json", "type": "completion", "field": "text"}
        return {"datasets": [text_entry]}, {"datasets": rows.summary() + "; every token supervised, as in the trial"}
    entry: dict[str, Any] = {
        "path": path,
        "ds_type": "json",
        "type": "chat_template",
        "field_messages": "messages",
        "message_property_mappings": {"role": "role", "content": "content"},
        "roles_to_train": ["assistant"],
        "train_on_eos": "turn",
    }
    comments = {
        "datasets": rows.summary() + "; the loss on the assistant turns and their end-of-turn token (axolotl does not "
        "supervise what the template writes after that token, a newline in ChatML, which the trial did: one token a "
        "turn)"
    }
    data: dict[str, Any] = {"datasets": [entry]}
    if rows.chat_template is False:
        data["chat_template"] = "jinja"
        data["chat_template_jinja"] = DEFAULT_CHAT_TEMPLATE
        comments["chat_template"] = "the tokenizer has no chat template: the trial rendered this ChatML"
    else:
        data["chat_template"] = "tokenizer_default"
        comments["chat_template"] = "the tokenizer's own chat template, which the trial rendered" + (
            "" if rows.chat_template else " (the tokenizer could not be loaded here to check it has one)"
        )
    if rows.eos_after_completion:
        comments["datasets"] += _EOS_NOTE
    return data, comments


_EOS_NOTE = (
    "; the trial also ended each reply with the end-of-sequence token, which the template's end of turn is not "
    "(one token a row that this entry does not train)"
)


def llama_factory_dataset(rows: TrialRows, folder: Path, name: str) -> tuple[dict[str, Any], dict[str, str], str]:
    """LLaMA-Factory 0.9.5's keys for the rows (``dataset``, ``dataset_dir``, ``template``), their comments, and the
    ``dataset_info.json`` that registers them (``formatting: sharegpt`` over ``messages``, role/content tags).

    The template: left unset when the tokenizer has a chat template (LLaMA-Factory then parses the tokenizer's own,
    ``template.py: parse_template``, as the trial rendered it); ``chatml`` when it has none. Text rows have no
    equivalent (LLaMA-Factory trains text only at ``stage: pt``, which joins rows into ``cutoff_len`` blocks): no
    dataset keys, and a comment says why.
    """
    if rows.kind == "text":
        why = (
            rows.summary() + "; not registered: LLaMA-Factory trains text rows only at stage pt, which joins them "
            "into cutoff_len blocks where the trial trained each row alone (use --format axolotl, hf or trl)"
        )
        return {}, {"stage": why}, ""
    info = {
        name: {
            "file_name": ROWS_FILE,
            "formatting": "sharegpt",
            "columns": {"messages": "messages"},
            "tags": {
                "role_tag": "role",
                "content_tag": "content",
                "user_tag": "user",
                "assistant_tag": "assistant",
                "system_tag": "system",
                "observation_tag": "tool",
            },
        }
    }
    note = rows.summary() + f", registered in {folder / LLAMA_FACTORY_INFO}"
    if rows.not_alternating:
        note += (
            f"; {rows.not_alternating} of them do not alternate user and assistant turns (or end on another turn): "
            "LLaMA-Factory skips them, the trial trained them"
        )
    if rows.eos_after_completion:
        note += _EOS_NOTE
    data: dict[str, Any] = {"dataset": name, "dataset_dir": str(folder)}
    comments = {"dataset": note}
    if rows.chat_template is False:
        data["template"] = "chatml"
        comments["template"] = (
            "the tokenizer has no chat template: the trial rendered ChatML (LLaMA-Factory's chatml also makes "
            "<|im_end|> the end-of-sequence token, a new token when the vocabulary lacks it)"
        )
    else:
        comments["dataset_dir"] = (
            "no template key: LLaMA-Factory parses the tokenizer's own chat template, which the trial rendered"
        )
    return data, comments, json.dumps(info, indent=2) + "\n"
