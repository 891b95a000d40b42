"""Keras 3's optimizer algorithms as torch optimizers: what `compile(optimizer="rmsprop")` and the
other Keras names build, each computing Keras' update (keras/src/backend/torch/optimizers, 3.15).

Where torch's class computes Keras' update, it is kept with its fused / foreach fast paths:
`Adam` and `AdamW` are torch's, with epsilon moved to Keras' place (before the bias correction)
by rescaling it each step; `SGD`, `Adadelta` and `Adagrad` are torch's with Keras' decoupled
weight decay (SGD's momentum rescaled when the rate changes); Nadam is torch's `NAdam` with
`momentum_decay=1.0` (Keras' 0.96 ** step). `RMSprop` (epsilon inside the square root, momentum
over the scaled step), `Adamax` (epsilon outside the running maximum), `Lion` and `KerasAdagrad`
(Adagrad for an accumulator that starts near 0) are written here over torch's
`_foreach` kernels. The keywords are torch's (`lr`, `eps`, `betas`, `alpha` for Keras' `rho`)::

    opt = RMSprop(net.parameters(), lr=1e-3, alpha=0.9, eps=1e-7, momentum=0.9, centered=True)
    Model(net).compile(lambda params: RMSprop(params, momentum=0.9), "mse")

Weight decay is Keras': the weights shrink by `lr * weight_decay` before each update (decoupled),
not torch's L2 term added to the gradient.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


def _unhooked(step: Callable[..., Any]) -> Callable[..., Any]:
    """torch's `step` without the hook wrapper torch puts on a class's `step` once an instance
    exists: our subclass's own `step` already runs the step hooks once."""
    return step.__wrapped__ if getattr(step, "hooked", False) else step  # type: ignore[attr-defined]


def _closure_loss(closure: Callable[[], Any] | None) -> Any:
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


@contextlib.contextmanager
def _for_torch(groups: list[dict[str, Any]], key: str, value: Callable[[dict[str, Any]], Any]) -> Iterator[None]:
    """Each group's `key` set to `value(group)` while torch's step runs, then given back: the
    groups keep Keras' hyperparameters outside `step`."""
    kept = [group[key] for group in groups]
    for group in groups:
        group[key] = value(group)
    try:
        yield
    finally:
        for group, old in zip(groups, kept):
            group[key] = old


def _decay(group: dict[str, Any], params: list[torch.Tensor]) -> None:
    """Keras' weight decay: `w -= w * weight_decay * lr`, before the update."""
    if group["weight_decay"] and params:
        with torch.no_grad():
            torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])


class _DecoupledDecay(torch.optim.Optimizer):
    """A torch class whose `weight_decay` is an L2 term, made to decay the weights as Keras does:
    the decay is applied here and torch's step runs with `weight_decay` 0."""

    _torch_step: Callable[..., Any]

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = _closure_loss(closure)
        for group in self.param_groups:
            _decay(group, [p for p in group["params"] if p.grad is not None])
        with _for_torch(self.param_groups, "weight_decay", lambda group: 0.0):
            _unhooked(type(self)._torch_step)(self)
        return loss


class SGD(_DecoupledDecay, torch.optim.SGD):
    """Keras' SGD: torch's (fused where torch has it) with Keras' decoupled weight decay. torch
    keeps the momentum buffer in gradient units (scaled by the rate at each step), Keras in step
    units (each gradient scaled by the rate of its own step): when the rate changes, torch's
    buffer is rescaled by `old_lr / new_lr`, which makes torch's step Keras' (with or without
    Nesterov). The rate last stepped with is `group["keras_lr"]`."""

    _torch_step = torch.optim.SGD.step

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        for group in self.param_groups:
            lr, last = group["lr"], group.get("keras_lr")
            if group["momentum"] and last and lr and last != lr:
                buffers = [self.state[p]["momentum_buffer"] for p in group["params"]
                           if self.state.get(p, {}).get("momentum_buffer") is not None]
                if buffers:  # no autograd: buffers never require a gradient
                    torch._foreach_mul_(buffers, float(last) / float(lr))
            group["keras_lr"] = lr
        return super().step(closure)


class Adadelta(_DecoupledDecay, torch.optim.Adadelta):
    """Keras' Adadelta: torch's algorithm is Keras' (epsilon in both square roots), with Keras'
    decoupled weight decay."""

    _torch_step = torch.optim.Adadelta.step


class Adagrad(_DecoupledDecay, torch.optim.Adagrad):
    """Keras' Adagrad as the name "adagrad" builds it: torch's (fused where torch has it), with
    Keras' decoupled weight decay. torch divides by `sqrt(acc) + eps`, Keras by `sqrt(acc + eps)`:
    with Keras' default accumulator (0.1, so `acc >= 0.1`) the two differ by under 2e-7 of the
    denominator, below float32 rounding (measured: the same weights). For an accumulator that
    starts near 0 use `KerasAdagrad`, which computes Keras' formula."""

    _torch_step = torch.optim.Adagrad.step


class _KerasEpsilon(torch.optim.Optimizer):
    """Adam's epsilon in Keras' place. Keras divides by `sqrt(v) + eps` and scales the rate by
    `sqrt(1 - beta_2 ** t)`; torch divides by `sqrt(v) / sqrt(1 - beta_2 ** t) + eps`. torch's
    step with `eps / sqrt(1 - beta_2 ** t)` is Keras' step exactly, so torch's fused and foreach
    kernels run unchanged; `group["eps"]` reads Keras' epsilon outside `step`. `t` is counted per
    parameter group (`group["keras_step"]`, saved with the optimizer's state)."""

    _torch_step: Callable[..., Any]

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # a state saved by torch's class: its step count
            if "keras_step" not in group:
                steps = [self.state[p]["step"] for p in group["params"] if "step" in self.state.get(p, {})]
                group["keras_step"] = int(steps[0]) if steps else 0

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = _closure_loss(closure)
        groups = self.param_groups
        kept = []  # Keras' epsilons, given back after torch's step (written out: this runs every step)
        for group in groups:
            t = group.get("keras_step", 0)
            for p in group["params"]:
                if p.grad is not None:
                    t += 1
                    break
            group["keras_step"] = t
            eps = group["eps"]
            kept.append(eps)
            group["eps"] = eps / math.sqrt(1 - group["betas"][1] ** max(t, 1))
        try:
            _unhooked(type(self)._torch_step)(self)
        finally:
            for group, eps in zip(groups, kept):
                group["eps"] = eps
        return loss


class Adam(_KerasEpsilon, torch.optim.Adam):
    """Keras' Adam (and AMSGrad): torch's Adam, fused where torch has it, epsilon in Keras' place."""

    _torch_step = torch.optim.Adam.step


class AdamW(_KerasEpsilon, torch.optim.AdamW):
    """Keras' AdamW: torch's AdamW (the same decoupled decay), epsilon in Keras' place."""

    _torch_step = torch.optim.AdamW.step


class ForeachOptimizer(torch.optim.Optimizer):
    """The base of the optimizers written here: Keras' decoupled weight decay, then `_update` over
    the parameters that have a gradient (a sparse gradient is made dense: Keras' update of the
    rows without a gradient is no change, as it is here). Always `foreach` (torch's multi-tensor
    kernels; on CPU they loop in C++)."""

    def __init__(self, params: Params, defaults: dict[str, Any]) -> None:
        if defaults["lr"] < 0:
            raise ValueError(f"`lr` must be at least 0, got {defaults['lr']}")
        if defaults["weight_decay"] < 0:
            raise ValueError(f"`weight_decay` must be at least 0, got {defaults['weight_decay']}")
        super().__init__(params, {**defaults, "foreach": True})

    def _state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """The per-parameter state, created at the first step."""
        raise NotImplementedError

    def _update(self, group: dict[str, Any], params: list[torch.Tensor], grads: list[torch.Tensor],
                states: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in params]
            states = []
            for p in params:
                if not self.state[p]:
                    self.state[p] = self._state(p, group)
                states.append(self.state[p])
            _decay(group, params)
            self._update(group, params, grads, states)
        return loss


def _pick(states: list[dict[str, Any]], key: str) -> list[torch.Tensor]:
    return [s[key] for s in states]


class RMSprop(ForeachOptimizer):
    """Keras' RMSprop: epsilon inside the square root (torch adds it outside), `alpha` is Keras'
    `rho`, momentum accumulates the scaled step `lr * g / sqrt(v + eps)`, `centered` subtracts
    the squared mean gradient under the root."""

    def __init__(self, params: Params, lr: float = 1e-3, alpha: float = 0.9, eps: float = 1e-7,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"`alpha` (Keras' rho) must be in [0, 1], got {alpha}")
        if momentum < 0:
            raise ValueError(f"`momentum` must be at least 0, got {momentum}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered))

    def _state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        state = {"square_avg": torch.zeros_like(p, memory_format=torch.preserve_format)}
        if group["momentum"] > 0:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if group["centered"]:
            state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def _update(self, group: dict[str, Any], params: list[torch.Tensor], grads: list[torch.Tensor],
                states: list[dict[str, Any]]) -> None:
        rho, lr = group["alpha"], float(group["lr"])
        velocities = _pick(states, "square_avg")
        torch._foreach_mul_(velocities, rho)
        torch._foreach_addcmul_(velocities, grads, grads, value=1 - rho)
        if group["centered"]:
            averages = _pick(states, "grad_avg")
            torch._foreach_mul_(averages, rho)
            torch._foreach_add_(averages, grads, alpha=1 - rho)
            denominators = torch._foreach_addcmul(velocities, averages, averages, value=-1)
            torch._foreach_add_(denominators, group["eps"])
        else:
            denominators = torch._foreach_add(velocities, group["eps"])
        torch._foreach_sqrt_(denominators)
        if group["momentum"] > 0:
            buffers = _pick(states, "momentum_buffer")
            torch._foreach_mul_(buffers, group["momentum"])
            torch._foreach_addcdiv_(buffers, grads, denominators, value=lr)
            torch._foreach_add_(params, buffers, alpha=-1)
        else:
            torch._foreach_addcdiv_(params, grads, denominators, value=-lr)


class KerasAdagrad(ForeachOptimizer):
    """Keras' Adagrad for any `initial_accumulator_value`: `w -= lr * g / sqrt(acc + eps)`,
    epsilon inside the square root (torch adds it outside; see `Adagrad`)."""

    def __init__(self, params: Params, lr: float = 1e-3, initial_accumulator_value: float = 0.1,
                 eps: float = 1e-7, weight_decay: float = 0.0) -> None:
        if initial_accumulator_value < 0:
            raise ValueError(f"`initial_accumulator_value` must be at least 0, got {initial_accumulator_value}")
        super().__init__(params, dict(lr=lr, initial_accumulator_value=initial_accumulator_value, eps=eps,
                                      weight_decay=weight_decay))

    def _state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        value = group["initial_accumulator_value"]
        return {"sum": torch.full_like(p, value, memory_format=torch.preserve_format)}

    def _update(self, group: dict[str, Any], params: list[torch.Tensor], grads: list[torch.Tensor],
                states: list[dict[str, Any]]) -> None:
        sums = _pick(states, "sum")
        torch._foreach_addcmul_(sums, grads, grads)
        roots = torch._foreach_add(sums, group["eps"])
        torch._foreach_sqrt_(roots)
        torch._foreach_addcdiv_(params, grads, roots, value=-float(group["lr"]))


class Adamax(ForeachOptimizer):
    """Keras' Adamax: `u = max(beta_2 * u, |g|)`, `w -= lr * m / ((u + eps) * (1 - beta_1 ** t))`
    (torch adds epsilon inside the maximum, where it accumulates)."""

    def __init__(self, params: Params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-7, weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def _state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        zeros = torch.zeros_like(p, memory_format=torch.preserve_format)
        return {"step": torch.tensor(0.0), "exp_avg": zeros, "exp_inf": zeros.clone()}

    def _update(self, group: dict[str, Any], params: list[torch.Tensor], grads: list[torch.Tensor],
                states: list[dict[str, Any]]) -> None:
        beta_1, beta_2 = group["betas"]
        corrections = []
        for state in states:
            state["step"] += 1
            corrections.append(1 - beta_1 ** float(state["step"]))
        moments, norms = _pick(states, "exp_avg"), _pick(states, "exp_inf")
        torch._foreach_mul_(moments, beta_1)
        torch._foreach_add_(moments, grads, alpha=1 - beta_1)
        torch._foreach_mul_(norms, beta_2)
        torch._foreach_maximum_(norms, torch._foreach_abs(grads))
        denominators = torch._foreach_add(norms, group["eps"])
        torch._foreach_mul_(denominators, corrections)
        torch._foreach_addcdiv_(params, moments, denominators, value=-float(group["lr"]))


class Lion(ForeachOptimizer):
    """Keras' Lion: `w -= lr * sign(beta_1 * m + (1 - beta_1) * g)`, then
    `m = beta_2 * m + (1 - beta_2) * g` (torch has no Lion)."""

    def __init__(self, params: Params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        if not (0.0 < betas[0] <= 1.0 and 0.0 <= betas[1] <= 1.0):
            raise ValueError(f"`betas` must be in (0, 1] and [0, 1] (Keras' beta_1, beta_2), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    def _state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        return {"exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format)}

    def _update(self, group: dict[str, Any], params: list[torch.Tensor], grads: list[torch.Tensor],
                states: list[dict[str, Any]]) -> None:
        beta_1, beta_2 = group["betas"]
        moments = _pick(states, "exp_avg")
        directions = torch._foreach_mul(moments, beta_1)
        torch._foreach_add_(directions, grads, alpha=1 - beta_1)
        torch._foreach_sign_(directions)
        torch._foreach_add_(params, directions, alpha=-float(group["lr"]))
        torch._foreach_mul_(moments, beta_2)
        torch._foreach_add_(moments, grads, alpha=1 - beta_2)
