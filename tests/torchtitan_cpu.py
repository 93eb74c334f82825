"""One rank of a torchtitan 0.3.0 training on CPU (gloo), for tests/test_torchtitan.py: run under
torchrun as ``python -m torch.distributed.run --standalone --nproc-per-node N tests/torchtitan_cpu.py
OUT -- <torchtitan arguments>``; writes ``OUT/rank<r>.pt`` (see :func:`_observe`).

The CPU shims torchtitan needs here, none of which touches the copies FSDP2 issues (each applied in
stock and mode runs alike):
- device: torchtitan takes "cuda" where no accelerator exists (tools/utils.py get_device_info):
  "cpu" and ``torch.cpu`` instead, set before the modules that import them by name, and a memory
  monitor that reports zeros (torch.cpu has no memory stats);
- gloo has no ``PREMUL_SUM``, which FSDP2 takes for torchtitan's gradient divide factor 1.0
  (distributed/fsdp.py disable_fsdp_gradient_division): FSDP2 sums instead
  (``set_force_sum_reduction_for_comms``), and then divides by 1.0 not at all, the same values;
- torch 2.13 has no ``torch.distributed.set_timeout`` (distributed/utils.py set_pg_timeouts):
  the timeouts stay as initialised;
- FlexAttention has no CPU backward on torch 2.13: :func:`sdpa_attention`, an ``@override``
  for ``--override.imports torchtitan_cpu.sdpa_attention``, swaps in SDPA (causal);
- the data: :data:`DATASET`, a small generated text registered as a torchtitan dataset, and
  :func:`write_tokenizer`, a word-level tokenizer for ``--hf-assets-path``.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # Through the module's import name, so that --override.imports finds this same module.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torchtitan_cpu

    torchtitan_cpu.main(sys.argv[1:])
    sys.exit(0)

import dataclasses  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import torchtitan.tools.utils as titan_utils

# Before any torchtitan module copies them (``from torchtitan.tools.utils import device_type``).
titan_utils.device_type, titan_utils.device_module = "cpu", torch.cpu

import torchtitan.components.metrics as titan_metrics  # noqa: E402
import torchtitan.distributed.fsdp as titan_fsdp  # noqa: E402
import torchtitan.distributed.utils as titan_dist_utils  # noqa: E402
from torchtitan.config.override import override  # noqa: E402
from torchtitan.hf_datasets import DatasetConfig  # noqa: E402
from torchtitan.hf_datasets import text_datasets  # noqa: E402
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention  # noqa: E402

DATASET = "npu_dispatch_test"
_WORDS = [f"w{i}" for i in range(500)]
_SPECIAL = ["<unk>", "<bos>", "<eos>"]


def _texts() -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(20, 200))) for _ in range(64)]


def write_tokenizer(folder: str) -> None:
    """A word-level tokenizer of the dataset's words (ids < 512) into ``folder``: tokenizer.json
    and tokenizer_config.json (bos and eos), as torchtitan's HuggingFaceTokenizer reads them."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab = {w: i for i, w in enumerate(_SPECIAL + _WORDS)}
    tokenizer = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    os.makedirs(folder, exist_ok=True)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}, f)


def _load_dataset(path: str):
    from datasets import Dataset

    return Dataset.from_dict({"text": _texts()})


text_datasets.DATASETS[DATASET] = DatasetConfig(path=DATASET, loader=_load_dataset,
                                                sample_processor=lambda sample: sample["text"])


@override(target=FlexAttention.Config, description="SDPA: FlexAttention has no CPU backward")
def sdpa_attention(cfg: FlexAttention.Config) -> ScaledDotProductAttention.Config:
    return ScaledDotProductAttention.Config()


@dataclasses.dataclass
class _Peak:
    max_active_gib: float = 0.0
    max_active_pct: float = 0.0
    max_reserved_gib: float = 0.0
    max_reserved_pct: float = 0.0
    num_alloc_retries: int = 0
    num_ooms: int = 0


class _CpuMemoryMonitor:
    device_name, device_capacity_gib = "cpu", 0.0

    def get_peak_stats(self):
        return _Peak()

    def reset_peak_stats(self):
        pass


titan_metrics.build_device_memory_monitor = _CpuMemoryMonitor

_disable_division = titan_fsdp.disable_fsdp_gradient_division


def _sum_without_premul(model) -> None:
    from torch.distributed.fsdp import FSDPModule

    _disable_division(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


titan_fsdp.disable_fsdp_gradient_division = _sum_without_premul
titan_dist_utils.set_pg_timeouts = lambda **kwargs: None


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.detach().reshape(-1).view(torch.uint8).clone()


def _observe(out: str) -> None:
    """Records, per rank into ``out/rank<r>.pt``: ``steps`` (per logged step: step, loss, max loss
    and grad norm as float.hex), ``seconds`` (host seconds of each train_step), ``params`` (name
    -> the bytes of this rank's shard of every parameter after training), ``trainer`` (its class
    name), ``collectives`` (all-gathers and reduce-scatters issued through torch.distributed) and
    ``ops`` (the mode's per-op stats, ``CopyStats.as_dict()["ops"]``; None without the mode)."""
    from torchtitan.trainer import Trainer

    steps, seconds, collectives = [], [], {"all_gather_single": 0, "reduce_scatter_single": 0}
    log, train_step, close = titan_metrics.MetricsProcessor.log, Trainer.train_step, Trainer.close

    def counted(name):
        collective = getattr(torch.distributed, name)

        def call(*args, **kwargs):
            collectives[name] += 1
            return collective(*args, **kwargs)

        return call

    # FSDP2's all-gathers and reduce-scatters (torch 2.13: _fsdp_collectives.py DefaultAllGather,
    # DefaultReduceScatter), counted apart from the mode's own counters.
    for name in collectives:
        setattr(torch.distributed, name, counted(name))

    def timed_train_step(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return train_step(self, *args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    def logged(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        steps.append({"step": step, "loss": float(global_avg_loss).hex(), "max_loss": float(global_max_loss).hex(),
                      "grad_norm": float(grad_norm).hex()})
        return log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics)

    def closing(self):
        mode = getattr(self, "npu_mode", None)
        torch.save({"steps": steps, "seconds": seconds, "trainer": type(self).__name__, "collectives": collectives,
                    "params": {n: _bits(p) for m in self.model_parts for n, p in m.named_parameters()},
                    "ops": mode.stats.as_dict()["ops"] if mode is not None else None},
                   os.path.join(out, f"rank{torch.distributed.get_rank()}.pt"))
        return close(self)

    Trainer.train_step, titan_metrics.MetricsProcessor.log, Trainer.close = timed_train_step, logged, closing


def main(argv: list[str]) -> None:
    """``argv``: OUT, "--", torchtitan's arguments; this rank's tokenizer goes to
    OUT/tokenizer-rank<r> (``--hf-assets-path``)."""
    out, sep, *args = argv
    assert sep == "--", "usage: torchtitan_cpu.py OUT -- <torchtitan arguments>"
    torch.set_num_threads(1)
    assets = os.path.join(out, f"tokenizer-rank{os.environ['RANK']}")
    write_tokenizer(assets)
    _observe(out)
    from torchtitan.train import main as train

    sys.argv = [sys.argv[0], *args, "--hf-assets-path", assets]
    train()

