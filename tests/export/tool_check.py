"""Run a production tool's own config parser on ``sweep export`` files, as its command line would, and print what
it made of them: LLaMA-Factory's ``get_train_args`` (``llamafactory-cli train FILE KEY=VALUE ...``) and the
``BitsAndBytesConfig`` it builds from them; axolotl's ``validate_config`` and ``normalize_config`` (``axolotl
train FILE``) and the ``BitsAndBytesConfig`` of its model loader; and (``-rows``) the input ids and labels each tool's
own dataset loader makes of the export's dataset entry. Nothing is trained and no weight is loaded.

Run as a script in a side environment that has the tool (``tests/fixtures/stacks/{llama-factory,axolotl}.txt``)::

    python tool_check.py llama-factory|llama-factory-rows|axolotl|axolotl-rows OVERRIDES_JSON FILE.yaml [...]

``OVERRIDES_JSON`` holds the keys a user adds to the export (``use_cpu`` on a machine without a GPU).
Prints one JSON list, one object per file: the parsed values, or ``{"error": ...}`` when the tool rejects it."""

from __future__ import annotations

import json
import sys
import traceback
from importlib import metadata
from typing import Any

#: What axolotl's validation is told of the GPU (its command line probes the real one): an Ampere card, which has
#: bfloat16 and TF32, so that ``tf32: auto`` would turn TF32 on.
AMPERE = {"bf16": True, "fp8": False, "tf32": True, "n_gpu": 1, "compute_capability": "sm_80"}


def _versions(*packages: str) -> dict[str, str]:
    return {p: metadata.version(p) for p in packages}


def _bnb(config: Any) -> dict[str, Any]:
    """The 4-bit settings of a ``BitsAndBytesConfig``, dtypes by name."""
    return {
        "load_in_4bit": config.load_in_4bit,
        "bnb_4bit_compute_dtype": str(config.bnb_4bit_compute_dtype).removeprefix("torch."),
        "bnb_4bit_quant_type": config.bnb_4bit_quant_type,
        "bnb_4bit_use_double_quant": config.bnb_4bit_use_double_quant,
        "bnb_4bit_quant_storage": str(config.bnb_4bit_quant_storage).removeprefix("torch."),
    }


def llama_factory(path: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """``llamafactory-cli train PATH KEY=VALUE ...``'s arguments: LLaMA-Factory reads the YAML (OmegaConf, the
    command line's overrides merged in) and parses it with ``get_train_args``; then the ``BitsAndBytesConfig`` its
    model loader would pass to ``from_pretrained``."""
    from llamafactory.hparams import get_train_args
    from llamafactory.hparams.parser import read_args
    from llamafactory.model.model_utils.quantization import configure_quantization
    from transformers import AutoConfig

    sys.argv = ["llamafactory-cli", path, *(f"{k}={json.dumps(v)}" for k, v in overrides.items())]
    model, data, training, finetuning, _ = get_train_args(read_args())
    init_kwargs: dict[str, Any] = {}
    configure_quantization(AutoConfig.from_pretrained(model.model_name_or_path), None, model, True, init_kwargs)
    return {
        "model_name_or_path": model.model_name_or_path,
        "stage": finetuning.stage,
        "do_train": training.do_train,
        "finetuning_type": finetuning.finetuning_type,
        "quantization_method": str(model.quantization_method.value),
        "quantization_bit": model.quantization_bit,
        "quantization_type": model.quantization_type,
        "double_quantization": model.double_quantization,
        "compute_dtype": str(model.compute_dtype).removeprefix("torch."),
        "bnb": _bnb(init_kwargs["quantization_config"]),
        "lora_rank": finetuning.lora_rank,
        "lora_alpha": finetuning.lora_alpha,
        "lora_dropout": finetuning.lora_dropout,
        "lora_target": finetuning.lora_target,
        "cutoff_len": data.cutoff_len,
        "dataset": data.dataset,
        "dataset_dir": data.dataset_dir,
        "template": data.template,
        "packing": data.packing,
        "neat_packing": data.neat_packing,
        "block_diag_attn": model.block_diag_attn,
        "upcast_layernorm": model.upcast_layernorm,
        "train_on_prompt": data.train_on_prompt,
        "per_device_train_batch_size": training.per_device_train_batch_size,
        "gradient_accumulation_steps": training.gradient_accumulation_steps,
        "learning_rate": training.learning_rate,
        "optim": str(getattr(training.optim, "value", training.optim)),
        "disable_gradient_checkpointing": model.disable_gradient_checkpointing,
        "max_grad_norm": training.max_grad_norm,
        "warmup_steps": training.warmup_steps,
        "weight_decay": training.weight_decay,
        "bf16": training.bf16,
        "fp16": training.fp16,
        "seed": training.seed,
        "output_dir": training.output_dir,
    }


def _torchaudio_stand_in() -> None:
    """A STAND-IN for torchaudio, which has no build for this venv's torch (the registry's last is for torch 2.11):
    LLaMA-Factory 0.9.5's ``data/mm_plugin.py`` imports it at module level and calls it only to load audio files
    (``torchaudio.load``, ``functional.resample``). The rows checked here are text; any use of the stand-in raises."""
    import importlib.machinery
    import types

    if "torchaudio" in sys.modules:
        return
    try:
        import torchaudio  # noqa: F401  (a real one, where it installs)
    except ImportError:
        stand_in = types.ModuleType("torchaudio")
        # A spec, as importlib.util.find_spec requires of a loaded module; with no installed distribution behind it,
        # transformers' is_torchaudio_available() still says False.
        stand_in.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)

        def refuse(name: str) -> Any:
            if name.startswith("__"):  # what importers and inspect look up on every module
                raise AttributeError(name)
            raise RuntimeError(f"torchaudio.{name}: this is tool_check.py's stand-in; no audio is loaded here")

        stand_in.__getattr__ = refuse  # type: ignore[method-assign]
        sys.modules["torchaudio"] = stand_in


def llama_factory_rows(path: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The tokens LLaMA-Factory trains on from the file's dataset entry, as ``llamafactory-cli train PATH`` builds
    them before its first step: the arguments parsed (:func:`llama_factory`'s way), its tokenizer loaded, its chat
    template chosen (``get_template_and_fix_tokenizer``: the file's ``template``, or one parsed from the tokenizer),
    and its dataset loaded and preprocessed (``get_dataset``, stage ``sft``): each row's ``input_ids`` and
    ``labels``, in the file's order, and the name of the template."""
    _torchaudio_stand_in()
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.hparams.parser import read_args
    from llamafactory.model import load_tokenizer

    sys.argv = ["llamafactory-cli", path, *(f"{k}={json.dumps(v)}" for k, v in overrides.items())]
    model, data, training, _, _ = get_train_args(read_args())
    module = load_tokenizer(model)
    template = get_template_and_fix_tokenizer(module["tokenizer"], data)
    rows = get_dataset(template, model, data, training, stage="sft", **module)["train_dataset"]
    return {
        "template": data.template,
        "eos_token": module["tokenizer"].eos_token,
        "input_ids": [list(r) for r in rows["input_ids"]],
        "labels": [list(r) for r in rows["labels"]],
    }


#: The keys of an axolotl export that the tests compare with the file.
AXOLOTL_KEYS = (
    "base_model",
    "lora_mlp_kernel",
    "lora_qkv_kernel",
    "lora_o_kernel",
    "lora_embedding_kernel",
    "load_in_4bit",
    "adapter",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "bnb_config_kwargs",
    "sequence_len",
    "excess_length_strategy",
    "sample_packing",
    "pad_to_sequence_len",
    "attn_implementation",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "optimizer",
    "gradient_checkpointing",
    "max_grad_norm",
    "warmup_steps",
    "weight_decay",
    "bf16",
    "fp16",
    "seed",
    "tf32",
    "output_dir",
    "datasets",
    "chat_template",
    "chat_template_jinja",
)


def _axolotl_values(cfg: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """:data:`AXOLOTL_KEYS` of a validated config, enums by value; each ``datasets`` entry in the keys the file
    gave it (axolotl fills in the rest)."""
    import enum

    def plain(v: Any) -> Any:
        return v.value if isinstance(v, enum.Enum) else v

    out = {k: plain(cfg.get(k)) for k in AXOLOTL_KEYS}
    given = raw.get("datasets") or []
    out["datasets"] = [{k: plain(entry.get(k)) for k in spec} for entry, spec in zip(cfg.get("datasets") or [], given)]
    return out


def axolotl(path: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """What ``axolotl train PATH`` makes of the file on an Ampere GPU: ``validate_config`` (with the GPU's
    capabilities, as its command line passes them, and without), ``normalize_config`` (offline: the model's config
    is read from its local folder), and the ``BitsAndBytesConfig`` of its ``ModelLoader``. ``tf32_unset`` and
    ``excess_length_strategy_unset`` are what the validation makes of those two keys when the file leaves them out;
    ``fractional_alpha_error`` is its answer to the file with half a unit added to ``lora_alpha``;
    ``lora_kernels_unset``: its fused LoRA kernel switches, validated and normalized, when the file leaves them out."""
    import yaml
    from axolotl.loaders.model import ModelLoader
    from axolotl.utils.config import normalize_config, validate_config
    from axolotl.utils.dict import DictDefault
    from transformers import AutoTokenizer

    with open(path, encoding="utf-8") as f:
        raw = {**yaml.safe_load(f), **overrides}
    env = {"torch_version": metadata.version("torch").split("+")[0]}

    def validate(data: dict[str, Any], capabilities: dict | None = AMPERE) -> DictDefault:
        return validate_config(
            DictDefault(json.loads(json.dumps(data))),
            capabilities=capabilities,
            env_capabilities=env if capabilities else None,
        )

    plain = validate(raw, None)
    cfg = validate(raw)
    out: dict[str, Any] = {"validated": _axolotl_values(cfg, raw)}
    out["validated_without_capabilities"] = _axolotl_values(plain, raw)
    without_kernels = {k: v for k, v in raw.items() if not k.endswith("_kernel")}
    kernels = validate(without_kernels)
    normalize_config(kernels)
    out["lora_kernels_unset"] = {k: kernels.get(k) for k in raw if k.endswith("_kernel")}
    unset = validate({k: v for k, v in raw.items() if k not in ("tf32", "excess_length_strategy")})
    out["tf32_unset"], out["excess_length_strategy_unset"] = unset.get("tf32"), unset.get("excess_length_strategy")
    try:
        validate({**raw, "lora_alpha": raw["lora_alpha"] + 0.5})
        out["fractional_alpha_error"] = None
    except Exception as exc:
        out["fractional_alpha_error"] = str(exc)
    normalize_config(cfg)
    out["normalized"] = {
        **_axolotl_values(cfg, raw),
        "torch_dtype": str(cfg.torch_dtype).removeprefix("torch."),
        "batch_size": cfg.batch_size,
        "model_config_type": cfg.model_config_type,
    }
    loader = ModelLoader(cfg, AutoTokenizer.from_pretrained(cfg.tokenizer_config))
    loader._set_quantization_config()
    out["bnb"] = _bnb(loader.model_kwargs["quantization_config"])
    return out


def axolotl_rows(path: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The tokens axolotl trains on from the file's ``datasets``, as ``axolotl train PATH`` builds them: the config
    validated and normalized, axolotl's tokenizer (``axolotl.loaders.load_tokenizer``, which sets the file's
    ``chat_template``), each entry loaded (``load_dataset_with_config``) and tokenized by its strategy
    (``get_dataset_wrapper``: ``chat_template``, ``completion``): each row's ``input_ids`` and ``labels``, in the
    file's order, before axolotl's length filter and truncation."""
    import yaml
    from axolotl.loaders import load_tokenizer
    from axolotl.utils.config import normalize_config, validate_config
    from axolotl.utils.data.shared import load_dataset_with_config
    from axolotl.utils.data.wrappers import get_dataset_wrapper
    from axolotl.utils.dict import DictDefault

    with open(path, encoding="utf-8") as f:
        raw = {**yaml.safe_load(f), "dataset_num_proc": 1, **overrides}
    cfg = validate_config(DictDefault(json.loads(json.dumps(raw))))
    normalize_config(cfg)
    tokenizer = load_tokenizer(cfg)
    ids, labels = [], []
    for entry in cfg.datasets:
        rows = load_dataset_with_config(entry, cfg.hf_use_auth_token, streaming=False)
        wrapped, _ = get_dataset_wrapper(entry, tokenizer, cfg, entry["type"], rows)
        for row in wrapped:
            ids.append(list(row["input_ids"]))
            labels.append(list(row["labels"]))
    return {"input_ids": ids, "labels": labels, "eos_token_id": tokenizer.eos_token_id}


def main(argv: list[str]) -> int:
    """``tool_check.py TOOL OVERRIDES_JSON FILE...``: print one JSON list, one object per file."""
    tool, overrides, paths = argv[0], json.loads(argv[1]), argv[2:]
    check = {
        "llama-factory": llama_factory,
        "llama-factory-rows": llama_factory_rows,
        "axolotl": axolotl,
        "axolotl-rows": axolotl_rows,
    }[tool]
    results: list[dict[str, Any]] = []
    for path in paths:
        try:
            results.append(check(path, overrides))
        except Exception as exc:  # the tool rejected the file: its message is the result
            results.append({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]})
    package = "llamafactory" if tool.startswith("llama-factory") else "axolotl"
    versions = _versions("torch", "transformers", "peft", "bitsandbytes", package)
    print(json.dumps([{**r, "versions": versions} for r in results], default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
