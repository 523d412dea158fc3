"""Loading (child side): the library versions a result records, and the 4-bit ``from_pretrained`` with
transformers' load-time warnings kept (:data:`LOAD_REPORT`), which is the only place an allocation failure inside its
weight conversion shows. torch and transformers are imported inside, when a trial loads."""

from __future__ import annotations

import logging
from importlib import metadata
from typing import Any

from sweeper.space import TrialConfig
from sweeper.trial._child.memory import mentions_oom


class LoadReport(logging.Handler):
    """Keeps what transformers reports while loading weights: an allocation failure inside its weight conversion
    reaches us only as text in that report, behind a generic RuntimeError."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record's message."""
        self.messages.append(record.getMessage())

    def mentions_oom(self) -> bool:
        """Whether a kept message reports an allocation failure."""
        return any(mentions_oom(m) for m in self.messages)


#: The process's load report: cleared at the start of each trial, filled while :func:`load_model` runs.
LOAD_REPORT = LoadReport()


def versions() -> dict[str, str | None]:
    """Installed versions of torch, transformers, peft, bitsandbytes, optuna and accelerate (None: not installed),
    and ``cuda``: torch's CUDA version when a device is available, else None."""
    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "peft", "bitsandbytes", "optuna", "accelerate"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    import torch

    out["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
    return out


def load_model(config: TrialConfig, model_path: str, cuda: bool) -> Any:
    """``from_pretrained`` in 4 bits, as a cold trial (and the production run) loads it."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.utils import logging as transformers_logging

    compute_dtype = getattr(torch, config.bnb_4bit_compute_dtype)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=config.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=config.bnb_4bit_use_double_quant,
        bnb_4bit_compute_dtype=compute_dtype,
    )
    # transformers reports a weight-conversion failure (an allocation that failed under the cap among them) as a
    # warning from whichever of its loggers loads the model, then raises a bare RuntimeError: its warnings are let
    # through while loading, into worker.log and into LOAD_REPORT, which tells an OOM from another error.
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_warning()
    root = logging.getLogger("transformers")
    root.addHandler(LOAD_REPORT)
    try:
        return AutoModelForCausalLM.from_pretrained(
            model_path,
            quantization_config=quantization,
            dtype=compute_dtype,  # unquantized layers load in the compute dtype; peft upcasts them to fp32 below
            attn_implementation=config.model.attn_implementation,
            trust_remote_code=config.model.trust_remote_code,
            device_map={"": 0} if cuda else None,
        )
    finally:
        root.removeHandler(LOAD_REPORT)
        transformers_logging.set_verbosity(verbosity)
