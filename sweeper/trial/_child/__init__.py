"""The trial process (child side): loads the model in 4 bits, attaches LoRA, trains with an instrumented
``transformers.Trainer``, diagnoses a NaN and measures peak memory under a real cap.

Run as ``python -m sweeper.trial._child.worker CONFIG.json RESULT.json`` by :func:`sweeper.trial.run_trial`; never
imported by the sweep process. These modules, with :mod:`sweeper.data` and :mod:`sweeper.model`, are the only ones
that import torch, transformers, peft or bitsandbytes (``.importlinter``).
"""
