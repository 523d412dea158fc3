"""From a study to a production config (``sweep export``): pick a trial of the front and write its settings for
transformers/peft, TRL, axolotl or LLaMA-Factory, or as JSON.

The export carries the trial's quantization, LoRA and batch settings as measured, and keeps the space's
``target_effective_batch_size`` through ``gradient_accumulation_steps`` (the short trials ran with their own). A
setting the target tool cannot express the way the trial ran it is said in a comment, never dropped silently.

One module a step, and one a target format:

- :mod:`._pick`: which trial (``--trial N``, or what a ``--pick`` chooses among the trials the format can express:
  the picks themselves are :mod:`sweeper.study.picks`), which formats can express it, the nearest one they can, and
  the one-line refusals;
- :mod:`._settings`: :class:`ExportSettings`, what every format writes, from the trial's stored config, in typed
  parts (:class:`QuantizationSettings`, :class:`LoraSettings`, :class:`TrainingSettings`, :class:`Provenance`);
- :mod:`._format`: :class:`ExportFormat`, what a format declares: its name, suffix, help line, what it cannot
  express (:class:`Limit`) and how it renders;
- :mod:`._hf` (``hf`` and ``trl`` ``.py`` files), :mod:`._axolotl`, :mod:`._llama_factory` (YAML, with
  :mod:`._yaml`) and :mod:`._json`: one renderer a format, each declaring its :class:`ExportFormat`;
- :mod:`._registry`: :data:`EXPORT_FORMATS`, the list of them, which the CLI, the pick and the write read. A new
  format is its module and one line there;
- :mod:`.trl_rows`: the ``trl`` file's row reader, a Python file copied into it as text (the file never imports
  sweeper);
- :mod:`._write`: where ``-o`` puts the files and the write;
- :mod:`.production`: the one reader of the user's own training config (axolotl, LLaMA-Factory, TRL, JSON), each
  tool's keys and defaults declared once; the policy guard carries it as a file; :mod:`._from` makes a space of it
  (``sweep init --from``) and :mod:`._onto` writes a trial's measured keys back onto it (``sweep export --onto``).
"""

from sweeper.export._from import space_from
from sweeper.export._onto import write_onto
from sweeper.export._pick import choose_for_format, inexpressible, pick_trial
from sweeper.export._registry import EXPORT_FORMATS, format_names
from sweeper.export._write import export_path, write_export

__all__ = [
    "EXPORT_FORMATS",
    "choose_for_format",
    "export_path",
    "format_names",
    "inexpressible",
    "pick_trial",
    "space_from",
    "write_export",
    "write_onto",
]
