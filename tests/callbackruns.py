"""Real tiny training runs with the checkpoint-strategy callbacks (HF Trainer and Lightning, CPU).

Same model, data and schedule as tests/realruns.py; each builder returns the output folder and
the callback, so tests can read the callback's records.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import realruns


def nan_callback(nan_step: int):
    """Fills every weight with NaN at the end of `nan_step`: every later loss is NaN."""
    import torch
    from transformers import TrainerCallback

    class Nan(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == nan_step:
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(math.nan)
            return control

    return Nan()


def hf_train(out: Path, policy, *, max_steps: int = 60, spike_step: Optional[int] = None,
             spike_scale: float = 4.0, nan_step: Optional[int] = None, best_oldest: bool = False,
             hooks: Optional[dict] = None, resume: Optional[str] = None, extra_callbacks=(), **cb_kwargs):
    """Train the tiny GPT-2 with HFCheckpointStrategy(policy). best_oldest: evaluate at every save
    with greater_is_better=True on eval_loss, so the Trainer's "best" is the *worst* (earliest)
    checkpoint: a best that keep_last would otherwise rotate away."""
    from transformers import Trainer

    from checkpoint_strategy.callbacks import HFCheckpointStrategy

    cb = HFCheckpointStrategy(policy, **cb_kwargs)
    for name, fn in (hooks or {}).items():
        setattr(cb.core, name, fn)
    args = realruns._training_args(out, max_steps=max_steps, save_steps=500)
    args.save_total_limit = 3   # turned off by the callback
    args.logging_nan_inf_filter = False   # log a NaN loss as NaN
    eval_ds = None
    if best_oldest:
        args.eval_strategy = "steps"
        args.eval_steps = cb.core.frequency
        args.metric_for_best_model = "eval_loss"
        args.greater_is_better = True
        eval_ds = realruns._TokenDataset(32, 16, 64, seed=1)
    callbacks = [realruns._spike_callback(spike_step, spike_scale), cb, *extra_callbacks]
    if nan_step is not None:
        callbacks.append(nan_callback(nan_step))
    trainer = Trainer(model=realruns._tiny_gpt2(), args=args, train_dataset=realruns._TokenDataset(4096, 16, 64),
                      eval_dataset=eval_ds, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return cb, trainer


def steps_in(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in Path(out).glob("checkpoint-*"))
