"""The row reader of ``sweep export --format trl``: the exported script's ``trl_dataset``, which reads a user's rows
(chat, ShareGPT, alpaca, prompt/completion or text) as the trial read them (:func:`sweeper.data.load_samples`: the
same rows kept, the same tokens supervised), and its ``build_trainer``, which builds TRL's ``SFTTrainer`` on them.

sweeper never imports this file: :func:`sweeper.export._hf.trl_rows_source` reads its text below the ``# fmt: off``
line with :mod:`importlib.resources` and writes it into the ``trl`` script as it stands, so that the script runs
without sweeper. Here it is linted and type-checked like the rest of the package, and it imports on its own: every
function but ``build_trainer`` runs without the script (``tests/export/test_export.py`` checks that
``trl_dataset`` keeps exactly the rows ``load_samples`` keeps). ``build_trainer`` uses six names the script defines
or imports above this part; they are declared below for the linter and the type checker only. ruff format leaves the
script's part as it is written (``# fmt: off``), and the one lint rule it does not follow is waived for the file
(below), so that the exported text stays the same.
"""

# The script's `kind == "messages" and not masks or kind == "alpaca"` reads as written (and binds so).
# ruff: noqa: RUF021

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # defined by the exported script above this part (sweeper.export._hf.render_hf)
    SFTTrainer: Any = None
    CHECKPOINTING = ""
    prepare_model_for_kbit_training: Any = None
    TRIAL_CHAT_TEMPLATE = ""
    lora_config: Any = None

    def make_sft_config(**overrides: Any) -> Any:
        """The script's ``SFTConfig`` with some keys replaced."""


# The trl script's text from the next line on: sweeper.export writes it into the script as it stands.
# fmt: off


def chat_template_masks_assistant(tokenizer):
    """Whether TRL can mask the assistant turns itself with this tokenizer's chat template (assistant_only_loss):
    the template has {% generation %} markers, or TRL ships a training version of it (Qwen3, Llama 3, ...)."""
    import re

    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if re.search(r"\{%-?\s*generation\s*-?%\}", template or ""):
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
    """A turn's content as the trial read it: text, or OpenAI-style text parts joined; None for what the trial did
    not train on (null, a number, an image part, a mapping)."""
    if isinstance(content, str):
        return content
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
            prompt += f"\n\n{got[2]}"
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
    # As the trial prepared it (the QLoRA recipe; TRL does not): the weights outside the 4-bit layers (embeddings,
    # norms, lm_head) in float32, no KV cache, checkpointing without reentrancy. Without it the run holds those
    # weights in the compute dtype: not the peak, nor the numerics, the trial measured.
    model.config.use_cache = False
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=bool(getattr(args, CHECKPOINTING)),
                                            gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=lora_config)
    # TRL casts the LoRA weights of a 4-bit model to bfloat16; the trial trained them in float32 (peft's default).
    for param in trainer.model.parameters():
        if param.requires_grad:
            param.data = param.data.to(torch.float32)
    return trainer
