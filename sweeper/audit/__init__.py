"""Dataset audit: what in the data, tokenized exactly as the trials tokenize it, would make a trial NaN, run out of
memory or learn the wrong thing (``sweep doctor``, and the check ``sweep run`` makes before its first trial).

Pure: works on :class:`~sweeper.data.Sample` and :class:`~sweeper.data.TokenizedSample` lists (tokenized once at
full length, then cut per ``max_seq_length`` as :func:`sweeper.data.tokenize_samples` cuts) and never imports torch.

Finding kinds (``Finding.kind``):

- ``no_supervised_tokens`` (per ``max_seq_length``): after truncation the sample has no token the loss is computed
  on. A step whose rows all are like that averages cross-entropy over zero tokens: the loss is 0/0 = NaN. NaN risk.
- ``invalid_token_id`` (per ``max_seq_length``): a token id outside the model's embedding (a tokenizer with added
  tokens the model was never resized for). An index error on the CPU, a device-side assert on CUDA. NaN risk.
- ``bad_embedding_row``: a special token the trials use (pad, eos, bos) whose input-embedding row in the checkpoint
  is NaN or infinite, or beyond float16's range when float16 compute is searched (the model loads in the compute
  dtype). Every row holding it or padded with it goes NaN: a masked position still enters attention with weight 0,
  and 0 x NaN is NaN (unsloth#4104). NaN risk.
- ``truncated`` (per ``max_seq_length``): samples longer than the limit; their tails are not trained on.
- ``too_long``: extreme outliers of the token-length distribution (beyond Tukey's far-out fence), the samples that
  set the memory peak of a run that pads to the longest row.
- ``repeated_span``: a run of one token, or of one n-gram of up to :data:`MAX_PERIOD` tokens, repeated many times
  (scraped boilerplate, a generation loop saved as data).
- ``empty_response``: an assistant reply that is empty or whitespace: the model is taught to answer nothing.
- ``duplicate``: samples with the same content (after collapsing whitespace).
- ``unusual_characters``: control characters, U+FFFD replacement characters (a decoding error upstream), or
  full-width punctuation in text that has no CJK characters (copy-paste from an IME).
- ``dropped_row`` (one per reason): dataset rows that give no sample (:class:`sweeper.data.DroppedRow`): a trial
  does not train on them. Indices are the rows'; ``samples`` of the report does not count them.
- ``generation_mask``: the chat template's ``{% generation %}`` markers supervise other tokens than the assistant
  replies and their end of turn (:func:`sweeper.data.mask_disagreements`); the trials train what the markers say,
  as TRL's ``assistant_only_loss`` does.

One module per part: the report and its findings (:mod:`._report`), lengths and text (:mod:`._lengths`), the
audit itself (:mod:`._findings`), and when a finding makes a trial NaN (:mod:`._nan`).
"""

from sweeper.audit._nan import NanRisk, nan_risks
from sweeper.audit._profile import DataProfile, profile_data
from sweeper.audit._report import AuditReport

__all__ = [
    "AuditReport",
    "DataProfile",
    "NanRisk",
    "nan_risks",
    "profile_data",
]
