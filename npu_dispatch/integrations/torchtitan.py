"""torchtitan training under :class:`~npu_dispatch.NpuFastCopyMode`: a module for torchtitan's
``--module``.

What it does: ``--config`` names a config function of any torchtitan model (torchtitan's own
config registries, unchanged); the config it returns is rebuilt as the config of a subclass of
that config's trainer class, whose ``train_step`` (forward, backward, gradient clipping and
optimizer step of one training step: every FSDP2 all-gather and reduce-scatter it issues) runs
inside one ``NpuFastCopyMode`` kept for the whole run. Results are bit for bit stock's. Validation
and checkpointing run outside the mode, as stock.

Command line (torchtitan's own launcher; ``--config`` is ``<module>.<config function>`` with
``<module>`` spelled as torchtitan's ``--module`` takes it, or the bare config function of one of
torchtitan's models, found by its model-name prefix)::

    torchrun --nproc_per_node 8 -m torchtitan.train \\
        --module npu_dispatch.integrations.torchtitan --config llama3.llama3_8b
    torchrun ... --module npu_dispatch.integrations.torchtitan --config llama3_debugmodel

Config field: ``npu_dispatch.enable`` (bool, default True); ``--npu-dispatch.no-enable`` runs the
same trainer without the mode (stock).

Stats: at the end of training (after the last step, or when training raises) each rank logs to
torchtitan's logger one line with the calls each copy op served on the fast path out of its
calls, and the fallback pairs per reason, then the table of ``mode.stats.report()``. The mode is
``trainer.npu_mode`` (None when disabled).

Mirrors torchtitan 0.3.0: ``torchtitan/trainer.py`` (class ``Trainer``, its nested ``Config`` and
``train_step``), ``torchtitan/config/configurable.py`` (``Configurable``: a ``Config`` nested in
a subclass makes ``config.build()`` construct that subclass) and ``torchtitan/config/manager.py``
(``ConfigManager._load_config``: how ``--module`` and ``--config`` are resolved).

Errors: importing this module without torchtitan raises ImportError; a config whose owner is not a
torchtitan ``Trainer`` subclass raises TypeError.
"""
import dataclasses
import functools
import importlib

import torch

try:
    from torchtitan.tools.logging import logger
    from torchtitan.trainer import Trainer
except ImportError as e:
    raise ImportError(
        f"npu_dispatch.integrations.torchtitan needs torchtitan (made for torchtitan 0.3.0): "
        f"pip install torchtitan==0.3.0 ({e})") from e

from npu_dispatch import NpuFastCopyMode

__all__ = ["NpuDispatchConfig", "NpuFastCopyTrainer", "fast_copy_trainer", "with_fast_copy", "summary"]


@dataclasses.dataclass(kw_only=True, slots=True)
class NpuDispatchConfig:
    enable: bool = True
    """Run each train_step under npu_dispatch.NpuFastCopyMode (False: stock)."""


class _FastCopy:
    """What the trainer subclasses add to their base trainer (first in their MRO)."""

    npu_mode: NpuFastCopyMode | None

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.npu_mode = NpuFastCopyMode() if config.npu_dispatch.enable else None

    def train_step(self, *args, **kwargs):
        if self.npu_mode is None:
            return super().train_step(*args, **kwargs)
        with self.npu_mode:
            return super().train_step(*args, **kwargs)

    def train(self, *args, **kwargs):
        try:
            return super().train(*args, **kwargs)
        finally:
            if self.npu_mode is not None:
                rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
                logger.info("rank %d: %s\n%s", rank, summary(self.npu_mode.stats), self.npu_mode.stats.report())


def summary(stats) -> str:
    """One line: per op the calls with a pair on the fast path out of all its calls, then the
    pairs that left it per reason (``stats``: a :class:`npu_dispatch.CopyStats`)."""
    d = stats.as_dict()
    served = ", ".join(f"{op} {v['fast_calls']}/{v['calls']}" for op, v in d["ops"].items()) or "no copy ops"
    reasons = ", ".join(f"{k} {n}" for k, n in sorted(d["fallback_reasons"].items()))
    return f"npu_dispatch: fast-path calls {served}; fallback pairs: {reasons or 'none'}"


@functools.cache
def fast_copy_trainer(base: type) -> type:
    """The subclass of ``base`` (torchtitan's ``Trainer`` or a subclass of it) whose
    ``train_step`` runs under the mode, with its ``Config`` (``base.Config`` plus the field
    ``npu_dispatch: NpuDispatchConfig``). Raises TypeError for any other class."""
    if not (isinstance(base, type) and issubclass(base, Trainer)):
        raise TypeError(f"npu_dispatch: {base!r} is not a torchtitan Trainer subclass")
    if issubclass(base, _FastCopy):
        return base
    config = dataclasses.make_dataclass(
        "Config", [("npu_dispatch", NpuDispatchConfig, dataclasses.field(default_factory=NpuDispatchConfig))],
        bases=(base.Config,), kw_only=True, slots=True)
    name = f"NpuFastCopy{base.__name__}"
    config.__module__, config.__qualname__ = __name__, f"{name}.Config"
    # Configurable.__init_subclass__ sets config._owner to the new class, so config.build()
    # constructs it.
    return type(name, (_FastCopy, base), {"Config": config, "__module__": __name__, "__qualname__": name,
                                          "__doc__": f"{base.__qualname__} with train_step under NpuFastCopyMode."})


NpuFastCopyTrainer = fast_copy_trainer(Trainer)


def with_fast_copy(config, *, enable: bool = True):
    """``config`` (a torchtitan trainer's ``Config``) as the config of its trainer's
    :func:`fast_copy_trainer` subclass, every field kept (shared, not copied) and
    ``npu_dispatch.enable`` set to ``enable``. Raises TypeError where its owner is not a
    ``Trainer`` subclass."""
    cls = fast_copy_trainer(type(config)._owner).Config
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    values["npu_dispatch"] = NpuDispatchConfig(enable=enable)
    return cls(**values)


def _registry(module_name: str):
    """The module holding config functions for ``module_name``, resolved as torchtitan 0.3.0's
    ``--module`` is (config/manager.py, ConfigManager._load_config)."""
    from torchtitan.experiments import _supported_experiments
    from torchtitan.models import _supported_models

    if module_name in _supported_models | _supported_experiments:
        candidates = [f"{p}.{module_name}.config_registry" for p in
                      ("torchtitan.models", "torchtitan.experiments", "torchtitan.experiments.rl.examples")]
    else:
        candidates = [f"{module_name}.config_registry", module_name]
    for candidate in candidates:
        try:
            return importlib.import_module(candidate)
        except ImportError:
            continue
    raise ImportError(f"npu_dispatch: cannot import a config registry for {module_name!r} (tried {candidates})")


def _config_function(name: str):
    """The config function ``name`` names (``<module>.<function>``, or a bare function of one of
    torchtitan's models whose name starts with the model's), or None."""
    module_name, _, fn_name = name.rpartition(".")
    if module_name:
        return getattr(_registry(module_name), fn_name, None)
    from torchtitan.models import _supported_models

    for model in sorted(_supported_models, key=len, reverse=True):  # qwen3_5 before qwen3
        if name.startswith(model + "_"):
            fn = getattr(_registry(model), name, None)
            if callable(fn):
                return fn
    return None


def __getattr__(name: str):
    # torchtitan's ConfigManager reads --config as an attribute of the --module module and calls it.
    if name.startswith("__"):
        raise AttributeError(name)
    fn = _config_function(name)
    if not callable(fn):
        raise AttributeError(f"npu_dispatch: no torchtitan config function {name!r}; spell --config as "
                             "<module>.<config function>, e.g. llama3.llama3_debugmodel")

    @functools.wraps(fn)
    def config():
        return with_fast_copy(fn())

    return config
