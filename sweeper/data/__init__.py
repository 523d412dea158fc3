"""Training samples: the built-in corpus, local files and hub datasets, in four formats, tokenized for causal-LM
fine-tuning with the loss on the reply only.

Loading (:func:`load_samples`) imports ``datasets`` only for files and hub ids; tokenization
(:func:`tokenize_samples`) needs a ``transformers`` fast tokenizer. Neither imports torch itself.

The modules: ``_samples`` (what a dataset becomes), ``_formats`` (one row to a sample), ``_load`` (files, hub, the
built-in corpus), ``_tokenize`` (templates, reply masks, truncation), ``_special`` (bad embedding rows of special
tokens), ``_worst`` (the whole file's worst step).
"""

from sweeper.data._formats import detect_format
from sweeper.data._load import load_samples
from sweeper.data._samples import DroppedRow, Sample, TokenizedSample, dataset_rows, describe_dropped, pack_groups
from sweeper.data._special import SpecialTokenRow, special_token_rows
from sweeper.data._tokenize import (
    DEFAULT_CHAT_TEMPLATE,
    audit_horizon,
    eos_appended,
    load_tokenizer,
    mask_disagreements,
    tokenize_samples,
    unused_rows,
)
from sweeper.data._worst import FileLengths, file_lengths, file_samples

__all__ = [
    "DEFAULT_CHAT_TEMPLATE",
    "DroppedRow",
    "FileLengths",
    "Sample",
    "SpecialTokenRow",
    "TokenizedSample",
    "audit_horizon",
    "dataset_rows",
    "describe_dropped",
    "eos_appended",
    "file_lengths",
    "file_samples",
    "load_samples",
    "load_tokenizer",
    "mask_disagreements",
    "pack_groups",
    "special_token_rows",
    "tokenize_samples",
    "unused_rows",
]
