"""First-batch checks: data that does not fit the module, the loss or the metrics fails at the
latest at the first step of its phase, before the step's backward and before anything is
written, with an error that names the argument and the likely fix (docs/common-errors.md lists
them). The checks are invisible to the run: they read nothing the run does not read, draw no
random number, and refuse nothing the Trainer (or Keras) accepts.

    check_data(stepper, module, train, metrics=specs, training=True)   # fit, before the loop
    check_data(stepper, module, val, metrics=specs)                      # its validation data
    check_data(stepper, module, source, with_loss=False)                 # predict

What is checked, in this order:

1. the data yields a batch, with targets where the loss needs them (training; validation with a
   compiled loss);
2. the features' dtype: integer features for a module whose first parameter is floating are a
   TypeError, unless the module's first layer with parameters is an Embedding;
3. NaN or inf in the first batch's features or targets: one `UserWarning` naming the argument;
4. on the run's own first forward of each phase (`FirstStep`, the `Stepper`'s hook): the module's
   exception, the named losses' rules (class labels: integer indices of shape (N,) in [0, C), or
   probabilities of the outputs' shape; binary targets: the outputs' shape, in [0, 1];
   regression: the outputs' shape), the loss itself (a scalar tensor) and every metric callable
   (a scalar tensor or a number). What raises is re-raised as a ValueError naming the argument,
   with the shapes, dtypes and likely fix, chained to it.

In-memory data (a `TensorSource`) is checked before the run: its first samples are sliced, which
draws nothing and runs no user code. Any other source (a DataLoader, a Dataset with a transform,
a collator with its own generator) is checked on the batch the run's first step reads, so no
sample, batch or collation is read twice and no generator moves. The validation data's first
batch, when in memory, is checked during the first training step, before its optimizer step
(the module runs on it only when its inputs differ in shape from the training batch's: eval
mode through the module's own `eval()`/`train()`, no gradients, every generator put back after);
a validation loader's at the first evaluation's first batch. Modules compiled with
`torch.compile` or holding lazy parameters are not probed.

Modules: `data` (`check_data`, arming), `first_step` (the checks at the first forward), `inputs`
(checks without a forward), `rules` (the losses' and metrics' rules, the fixes), `memo` (what was
checked already), `names` (how messages name things).
"""

from fitkit.engine.checks.data import check_data
from fitkit.engine.checks.first_step import FirstStep, unread
from fitkit.engine.checks.memo import CheckMemo
from fitkit.engine.checks.names import first_layer, keeps_float64

__all__ = ["CheckMemo", "FirstStep", "check_data", "first_layer", "keeps_float64", "unread"]
