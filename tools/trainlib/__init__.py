"""The pieces of `tools/train_default_models.py` and `tools/distill_smollm2.py`: presets, the
standard-library corpus, training steps and phases, evaluation, reports, and the distillation's
prompts, data and draft. The scripts put `tools/` on `sys.path` and import these modules."""
