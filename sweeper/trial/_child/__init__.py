"""The trial process (child side): loads the model in 4 bits, attaches LoRA, trains with an instrumented
``transformers.Trainer``, diagnoses a NaN and measures peak memory under a real cap.

Run as ``python -m sweeper.trial._child.worker --serve`` by :class:`sweeper.trial.TrialProcess` (or ``...worker
CONFIG.json RESULT.json`` for one trial); never imported by the sweep process. Its modules: ``worker`` (entry point
and job loop), ``recipe`` (setup, then train), ``warm`` (what a process keeps between trials), ``checks``
(quantization and LoRA targets), ``context`` (one trial as the recipe runs it), ``progress`` (the progress
lines sent to the sweep), ``load`` (``from_pretrained`` in 4 bits, versions), ``instrumented`` (the trainer
and its hooks), ``record`` (what training records, and the exceptions that stop it), ``outcome`` (how a trial ended:
a pure mapping), ``measurements``, ``diagnosis`` (why a NaN), ``memory`` (caps and peaks), ``_process``. These
modules, with :mod:`sweeper.data` and :mod:`sweeper.model`, are the only ones that import torch, transformers, peft
or bitsandbytes (``.importlinter``); they import the trial package's modules directly (``sweeper.trial._result``),
so that ``sweeper.trial._launch`` is never loaded in the trial process.
"""
