"""Rows and chat templates the data, audit and export tests share."""

from __future__ import annotations

TOPICS = ["lists", "tuples", "dicts", "sets", "strings", "bytes", "files", "loops", "classes", "modules"]

#: ChatML with transformers' generation markers around each reply and its end of turn, and a default system turn.
GENERATION_CHATML = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\nYou help.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
    "<|im_end|>\n{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def clean_rows() -> list[dict[str, str]]:
    """Ten distinct question/answer pairs of about the same length (prompt/completion rows), one per
    :data:`TOPICS`."""
    return [
        {"prompt": f"What are {t} in Python?", "completion": f"In Python, {t} are a built-in part of the language."}
        for t in TOPICS
    ]
