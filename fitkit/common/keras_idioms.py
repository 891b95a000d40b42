"""What to do instead of Keras' layer API called on a torch module: a forward that calls
`self.add_loss(...)` or `self.add_metric(...)` fails with an `AttributeError` that says only that
the module has no such attribute; `keras_idiom_hint` names fitkit's way::

    keras_idiom_hint(AttributeError("'Net' object has no attribute 'add_loss'"))
    # "`add_loss` is Keras' layer API ... return the extra loss ... override `compute_loss` ..."
"""

from __future__ import annotations

import re

_ATTRIBUTE = re.compile(r"object has no attribute '(\w+)'")

_HINTS = {
    "add_loss": ("`add_loss` is Keras' layer API, which a torch module does not have (fitkit has no add_loss): "
                 "return the extra loss from `forward` beside the output (`return out, penalty`) and add it in an "
                 "overridden `Model.compute_loss`, or compute it there from `self.module` (docs/customizing.md, "
                 "\"A loss with a penalty\")"),
    "add_metric": ("`add_metric` is Keras' layer API, which a torch module does not have: return the value from an "
                   "overridden `train_step` (`{'loss': loss, 'name': value}`, docs/customizing.md), or pass a metric "
                   "to `compile(metrics=[...])`"),
}


def keras_idiom_hint(err: BaseException) -> str | None:
    """The fix when `err` is a torch module's missing Keras layer method (`add_loss`,
    `add_metric`), else None."""
    if not isinstance(err, AttributeError):
        return None
    found = _ATTRIBUTE.search(str(err))
    return _HINTS.get(found.group(1)) if found else None
