"""Hugging Face's distributed-setup fields (`fsdp`, `fsdp_config`, `activation_checkpointing*`,
`accelerator_config`) as fitkit options, read as HF's `TrainingArguments` and Accelerate read them.

`fsdp` and `fsdp_config` become `strategy="fsdp"` and fitkit's `fsdp_*` options, with the units
Accelerate's FSDP2 plugin would shard::

    fsdp_options("full_shard auto_wrap", {"transformer_layer_cls_to_wrap": ["BertLayer"]})
    # ({"strategy": "fsdp", "fsdp_wrap": HFWrapPolicy("TRANSFORMER_BASED_WRAP", ("BertLayer",), 0),
    #   "fsdp_full_checkpoint": True, ...}, [])

The second value names the `fsdp_config` keys that cannot apply here (PyTorch/XLA's, and FSDP1's
tuning keys under `version=1`: fitkit runs FSDP2 for both versions), for the one warning of
`from_hf`. `activation_checkpointing` is the Trainer's call of the model's method, and
`accelerator_config` becomes fitkit's loader options (`split_batches`, `even_batches`,
`use_seedable_sampler`, `sync_each_batch`). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

#: Accelerate's `FSDP_AUTO_WRAP_POLICY` names.
WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
#: HF's legacy `fsdp` words (FSDP1's sharding strategies, "offload", "auto_wrap").
FSDP_WORDS = ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard", "offload", "auto_wrap")
#: A sharding strategy name as (fsdp_sharding, reshard_after_forward) of FSDP2.
_SHARDING = {"full_shard": ("full", True), "shard_grad_op": ("full", False), "hybrid_shard": ("hybrid", True),
             "hybrid_shard_zero2": ("hybrid", False)}
#: `fsdp_config` entries with no effect on what a run computes or saves here, at these values:
#: HF's own fill-ins, and PyTorch/XLA's switches when off.
_NEUTRAL = {"xla": False, "xla_fsdp_v2": False, "xla_fsdp_grad_ckpt": False, "xla_fsdp_settings": {}}
#: FSDP1's tuning keys (version=1 only; HF's FSDP2 plugin never reads them): FSDP2 has no such knob.
_FSDP1_ONLY = ("backward_prefetch", "forward_prefetch", "limit_all_gathers", "use_orig_params", "sync_module_states")
_READ = ("version", "reshard_after_forward", "cpu_offload", "auto_wrap_policy", "transformer_layer_cls_to_wrap",
         "min_num_params", "cpu_ram_efficient_loading", "state_dict_type", "activation_checkpointing")


@dataclasses.dataclass(frozen=True)
class HFWrapPolicy:
    """Which submodules become FSDP units, as Accelerate's FSDP2 plugin chooses them
    (`fsdp2_prepare_auto_wrap_policy`): "TRANSFORMER_BASED_WRAP" the classes named (by default the
    model's `_no_split_modules`), "SIZE_BASED_WRAP" modules of more than `min_num_params`
    parameters (none when 0), "NO_WRAP" none: the root alone::

        HFWrapPolicy("TRANSFORMER_BASED_WRAP", ("BertLayer",)).for_module(bert)(bert.encoder.layer[0])  # True
    """

    policy: str = "TRANSFORMER_BASED_WRAP"
    classes: tuple[str, ...] | None = None
    min_num_params: int = 0

    def for_module(self, root: Any) -> Any:
        """The predicate over `root`'s submodules; a class named that `root` does not hold is an error."""
        if self.policy == "SIZE_BASED_WRAP" and self.min_num_params > 0:
            return lambda m: sum(p.numel() for p in m.parameters()) > self.min_num_params
        if self.policy != "TRANSFORMER_BASED_WRAP":
            return lambda m: False
        names = self.classes if self.classes is not None else tuple(getattr(root, "_no_split_modules", None) or ())
        present = {type(m).__name__ for m in root.modules()}
        missing = [n for n in names if n not in present]
        if missing:
            raise ValueError(f"`fsdp_config['transformer_layer_cls_to_wrap']`: {missing} is no module class of "
                             f"{type(root).__name__} (its classes: {sorted(present)}); name classes it holds")
        return lambda m: type(m).__name__ in names



def as_bool(value: Any, name: str) -> bool:
    """HF's `str_to_bool` reading of a flag (True, "true", "1", "yes", ...); another value is an error."""
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ValueError(f"`{name}`={value!r} is invalid: pass True or False")


def read_config(config: Any, field: str) -> dict:
    """A dict field of HF's (`fsdp_config`, `deepspeed`, `accelerator_config`): the dict, or the JSON file at the path."""
    if isinstance(config, str):
        try:
            with open(config, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as err:
            raise ValueError(f"`{field}`: {config!r} is neither a dict nor a readable JSON file ({err}); "
                             "pass the dict, or the path of a JSON file holding it") from err
    if not isinstance(config, dict):
        raise ValueError(f"`{field}`={config!r} is invalid: pass a dict, or the path of a JSON file holding one")
    return dict(config)


def _words(fsdp: Any) -> list[str]:
    if fsdp is True:
        return []
    words = fsdp.split() if isinstance(fsdp, str) else list(fsdp) if isinstance(fsdp, (list, tuple)) else None
    if words is None:
        raise ValueError(f"`fsdp`={fsdp!r} is invalid: pass True, or HF's words {list(FSDP_WORDS)}")
    words = [str(getattr(w, "value", w)) for w in words]
    for word in words:
        if word == "no_shard":
            raise ValueError("`fsdp`='no_shard' replicates the whole model in every process: that is data "
                             "parallel, pass strategy='ddp' instead")
        if word not in FSDP_WORDS:
            raise ValueError(f"`fsdp`: {word!r} is not one of HF's words {list(FSDP_WORDS)}")
    return words


def fsdp_options(fsdp: Any, config: Any) -> tuple[dict[str, Any], list[str]]:
    """fitkit's options for HF's `fsdp` (None/False: off) and `fsdp_config`, and the `fsdp_config`
    keys that cannot apply (see the module docstring). With `fsdp` off only `fsdp_config`'s
    options are read (`cpu_ram_efficient_loading` etc.), the strategy left as it is."""
    config = {k[5:] if k.startswith("fsdp_") else k: v for k, v in read_config(config or {}, "fsdp_config").items()}
    on = bool(fsdp) and fsdp not in ("", "false", "False")
    words = _words(fsdp) if on else []
    version = int(config.get("version", 2))
    if version not in (1, 2):
        raise ValueError(f"`fsdp_config['version']`={config['version']!r} is invalid: pass 2 (FSDP2) or 1")
    options: dict[str, Any] = {"strategy": "fsdp"} if on else {}
    for word in words:  # HF's legacy words, under the config's own entries (setdefault)
        if word in _SHARDING:
            config.setdefault("reshard_after_forward", word)
        elif word == "offload":
            config.setdefault("cpu_offload", True)
    if "reshard_after_forward" in config:
        options.update(_reshard(config["reshard_after_forward"]))
    if "cpu_offload" in config:
        options["fsdp_cpu_offload"] = as_bool(config["cpu_offload"], "fsdp_config['cpu_offload']")
    if "activation_checkpointing" in config:
        options["fsdp_activation_checkpointing"] = as_bool(config["activation_checkpointing"],
                                                           "fsdp_config['activation_checkpointing']")
    if as_bool(config.get("cpu_ram_efficient_loading", False), "fsdp_config['cpu_ram_efficient_loading']"):
        options["fsdp_load_once"] = True
    state = str(config.get("state_dict_type", "FULL_STATE_DICT")).upper()
    if state not in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        raise ValueError(f"`fsdp_config['state_dict_type']`={config['state_dict_type']!r} is invalid: pass "
                         "'FULL_STATE_DICT' (one file) or 'SHARDED_STATE_DICT' (a shard per process)")
    if on or "state_dict_type" in config:
        options["fsdp_full_checkpoint"] = state == "FULL_STATE_DICT"
    if on or "auto_wrap_policy" in config or "transformer_layer_cls_to_wrap" in config or "min_num_params" in config:
        options["fsdp_wrap"] = _wrap(config)
    unread = [k for k, v in config.items() if k not in _READ and not (k in _NEUTRAL and not v)
              and not (k in _FSDP1_ONLY and version == 2)]
    return options, unread


def _reshard(value: Any) -> dict[str, Any]:
    """`reshard_after_forward`: a flag (FSDP2), or FSDP1's sharding strategy name (the legacy words)."""
    name = value.lower() if isinstance(value, str) else None
    if name == "no_shard":
        _words("no_shard")
    if name in _SHARDING:
        sharding, reshard = _SHARDING[name]
        return {"fsdp_reshard_after_forward": reshard, **({"fsdp_sharding": sharding} if sharding != "full" else {})}
    return {"fsdp_reshard_after_forward": as_bool(value, "fsdp_config['reshard_after_forward']")}


def _wrap(config: dict) -> HFWrapPolicy:
    policy = str(config.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP"))
    if policy not in WRAP_POLICIES:
        raise ValueError(f"`fsdp_config['auto_wrap_policy']`={policy!r} is invalid: pass one of {list(WRAP_POLICIES)}")
    names = config.get("transformer_layer_cls_to_wrap")
    if isinstance(names, str):
        names = [names]
    if names is not None and not (isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)):
        raise ValueError(f"`fsdp_config['transformer_layer_cls_to_wrap']`={names!r} is invalid: pass class names, "
                         "e.g. ['LlamaDecoderLayer']")
    minimum = config.get("min_num_params", 0)
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 0:
        raise ValueError(f"`fsdp_config['min_num_params']`={minimum!r} is invalid: pass a whole number >= 0")
    return HFWrapPolicy(policy, tuple(names) if names is not None else None, minimum)


def activation_options(enabled: Any, kwargs: Any) -> dict[str, Any]:
    """HF's `activation_checkpointing` (+ `_kwargs`) as fitkit's `gradient_checkpointing` (+ `_kwargs`):
    the Trainer's `activation_checkpointing_enable(...)` of a transformers model, which fitkit calls
    at fit (`every_n_layers` and `offload` are that method's own keywords). HF mirrors them into
    `gradient_checkpointing*`; what is off or None here leaves those copies in force."""
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(f"`activation_checkpointing_kwargs`={kwargs!r} is invalid: pass a dict (or None)")
    out: dict[str, Any] = {}
    if enabled is not None and as_bool(enabled, "activation_checkpointing"):  # off: the older names' copies stand
        out["gradient_checkpointing"] = True
    if kwargs:
        out["gradient_checkpointing_kwargs"] = dict(kwargs)
    return out


#: `accelerator_config` entries fitkit follows, as fitkit options of the same name (Accelerate's training loader).
_ACCELERATOR_READ = ("split_batches", "even_batches", "use_seedable_sampler")
#: `gradient_accumulation_kwargs` keys with no effect on the Trainer's run: it steps its own scheduler (not
#: Accelerate's, which `adjust_scheduler` acts on) and sets when gradients sync itself (`sync_with_dataloader`).
_NO_EFFECT = ("adjust_scheduler", "sync_with_dataloader")
#: What fitkit does by itself for each entry left unread, at Accelerate's default.
_ACCELERATOR_DEFAULTS = {"dispatch_batches": None, "use_configured_state": False}


def accelerator_options(config: Any, accumulation: int = 1) -> tuple[dict[str, Any], list[str]]:
    """fitkit's options for HF's `accelerator_config` (a dict, a JSON file's path, or transformers'
    `AcceleratorConfig`), and the entries that cannot apply here (away from Accelerate's defaults).
    `accumulation`: HF's `gradient_accumulation_steps`, which `gradient_accumulation_kwargs["num_steps"]`
    replaces when it is 1, as the Trainer's (an error otherwise)::

        accelerator_options({"split_batches": True, "gradient_accumulation_kwargs": {"sync_each_batch": True}})
        # ({"split_batches": True, "sync_each_batch": True}, [])

    `non_blocking` is followed as it is (fitkit's copies to a GPU are non-blocking either way)."""
    if config is None:
        return {}, []
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    config = read_config(config, "accelerator_config")
    options = {k: as_bool(config[k], f"accelerator_config[{k!r}]") for k in _ACCELERATOR_READ if k in config}
    options.update(_accumulation_options(config.get("gradient_accumulation_kwargs"), accumulation))
    unread = [k for k, v in config.items() if k in _ACCELERATOR_DEFAULTS and v != _ACCELERATOR_DEFAULTS[k]]
    unread += [k for k in config if k not in _ACCELERATOR_DEFAULTS and k not in _ACCELERATOR_READ
               and k not in ("non_blocking", "gradient_accumulation_kwargs")]
    return options, unread


def _accumulation_options(kwargs: Any, accumulation: int) -> dict[str, Any]:
    """`gradient_accumulation_kwargs` (Accelerate's `GradientAccumulationPlugin` keywords) as fitkit options."""
    if not kwargs:
        return {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"`accelerator_config['gradient_accumulation_kwargs']`={kwargs!r} is invalid: pass a dict")
    unknown = [k for k in kwargs if k not in ("num_steps", "sync_each_batch", *_NO_EFFECT)]
    if unknown:
        raise ValueError(f"`accelerator_config['gradient_accumulation_kwargs']`: {unknown} are not keywords of "
                         "Accelerate's GradientAccumulationPlugin; use num_steps, sync_each_batch, adjust_scheduler "
                         "or sync_with_dataloader")
    options: dict[str, Any] = {}
    if "num_steps" in kwargs:
        if accumulation > 1:
            raise ValueError("`accelerator_config['gradient_accumulation_kwargs']['num_steps']` and "
                             "`gradient_accumulation_steps` > 1 are both set: pass only one of them")
        options["gradient_accumulation_steps"] = kwargs["num_steps"]
    if "sync_each_batch" in kwargs:
        options["sync_each_batch"] = as_bool(kwargs["sync_each_batch"],
                                             "accelerator_config['gradient_accumulation_kwargs']['sync_each_batch']")
    return options
