"""Cold-start SFT of a Hugging Face causal LM on the Stage Bank SFT view.

Reads the rows :func:`bat_gym.sft.export_sft` writes (``train.jsonl``,
``validation.jsonl``: ``input_ids`` and ``labels``, with ``labels == -100`` outside the
target action) and fits the model to the target tokens only.

Objective of one optimizer step over its global batch ``B`` (all micro-batches of the
accumulation together), with ``S`` the set of target tokens in ``B``::

    L = (1 / |S|) * sum_{(i,t) in S} -log p_theta(x_{i,t} | x_{i,<t})

Every target token in the global batch weighs the same, so the loss and its gradient
do not depend on how the batch is cut into micro-batches, nor on padding: each
micro-batch contributes its NLL *sum* divided by the global ``|S|``, counted before the
first forward pass. (A per-micro-batch mean would up-weight the tokens of short rows.)

Runs resume exactly: the data order is a pure function of ``(seed, epoch)``, and a
checkpoint holds the weights, tokenizer, optimizer, scheduler, RNG states and the data
position, so a run stopped after step ``k`` and resumed reaches the same weights as an
uninterrupted one (bit for bit on CPU; GPU kernels may add last-bit noise).

Single device, fp32 master weights, optional bf16 autocast. The BaT recipe
(REFERENCE: full parameter, bf16, global batch 32, lr 2e-5, 200 steps) maps to the
defaults below with ``micro_batch_size * grad_accum_steps = 32``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from bat_gym.core.errors import ConfigError
from bat_gym.sft.rows import IGNORE_INDEX

try:
    import torch
    import torch.nn.functional as F
    from torch import Tensor
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("bat_gym.trainers.sft needs torch: pip install 'bat-gym[train]'") from exc

from bat_gym.trainers.activation_checkpointing import set_activation_checkpointing  # noqa: E402
from bat_gym.trainers.checkpoints import (  # noqa: E402 - after the torch check
    CheckpointDir,
    load_resume_state,
    publish,
    resolve_bf16,
    resolve_device,
    rng_state,
    set_rng_state,
)
from bat_gym.trainers.configs import SFTConfig  # noqa: E402
from bat_gym.trainers.schedule import lr_scheduler  # noqa: E402
from bat_gym.trainers.tiled_mlp import set_mlp_tiling  # noqa: E402

__all__ = [
    "SFTConfig",
    "Example",
    "load_sft_jsonl",
    "collate",
    "masked_nll",
    "target_nll",
    "resolve_bf16",
    "latest_checkpoint",
    "train",
]

log = logging.getLogger(__name__)

Example = dict[str, list[int]]
"""One tokenized row: ``input_ids`` and ``labels``, equal lengths, unpadded."""

# Fields a resumed run may change without breaking exact continuation; every other
# field shapes the math (data order, optimizer, precision) and must match the checkpoint.
_FREE_ON_RESUME = frozenset(
    {"model", "data_dir", "output_dir", "max_steps", "eval_every", "save_every", "keep_last"}
    | {"log_every", "device", "resume", "gradient_checkpointing", "mlp_chunk_size"}
)
_STATE = "trainer_state.pt"


# --------------------------------------------------------------------------- data


def _check_example(ex: dict[str, Any], where: str) -> Example:
    ids, labels = ex.get("input_ids"), ex.get("labels")
    if not isinstance(ids, list) or not isinstance(labels, list) or not ids:
        raise ConfigError(f"{where}: needs non-empty input_ids and labels lists")
    if len(ids) != len(labels):
        raise ConfigError(f"{where}: {len(ids)} input_ids but {len(labels)} labels")
    if any(lab != IGNORE_INDEX and lab != tok for tok, lab in zip(ids, labels, strict=True)):
        raise ConfigError(f"{where}: a label is neither {IGNORE_INDEX} nor its input id")
    return {"input_ids": ids, "labels": labels}


def load_sft_jsonl(path: str | Path) -> list[Example]:
    """Read an :func:`~bat_gym.sft.export_sft` split: one example per line, in file order.

    Only ``input_ids`` and ``labels`` are kept; the export writes them unpadded with
    ``labels[i]`` either ``input_ids[i]`` (target action) or -100 (everything else).

    Raises:
        ValueError: a line lacks the fields or they disagree.
    """
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                out.append(_check_example(json.loads(line), f"{path}:{n}"))
    return out


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, Tensor]:
    """Right-pad examples into a batch; padding gets label -100 and attention 0.

    Right padding keeps every real token at its unpadded position, so a causal model
    scores it exactly as it would alone.

    Returns:
        ``input_ids``, ``labels``, ``attention_mask``: (B, T) long tensors, ``T`` the
        longest example.
    """
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n] = torch.tensor(e["input_ids"])
        labels[i, :n] = torch.tensor(e["labels"])
        attn[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": attn}


def _n_targets(e: Example) -> int:
    # Position 0 is never predicted, so only labels[1:] can carry loss.
    return sum(1 for lab in e["labels"][1:] if lab != IGNORE_INDEX)


def _fingerprint(examples: Sequence[Example]) -> str:
    h = hashlib.sha256()
    for e in examples:
        h.update(len(e["input_ids"]).to_bytes(8, "little"))
        h.update(np.asarray(e["input_ids"], dtype=np.int64).tobytes())
        h.update(np.asarray(e["labels"], dtype=np.int64).tobytes())
    return h.hexdigest()


def _sample_order(n: int, seed: int, epoch: int) -> np.ndarray:
    # A fresh permutation per epoch, a pure function of (seed, epoch): resuming needs
    # only the position in the stream, never a saved sampler object.
    return np.random.default_rng([seed, epoch]).permutation(n)


def _batch_indices(n: int, seed: int, start: int, size: int) -> list[int]:
    """Rows ``start .. start+size-1`` of the endless stream of per-epoch permutations."""
    out, orders = [], {}
    for k in range(start, start + size):
        epoch = k // n
        if epoch not in orders:
            orders[epoch] = _sample_order(n, seed, epoch)
        out.append(int(orders[epoch][k % n]))
    return out


# --------------------------------------------------------------------------- loss


def masked_nll(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Summed next-token NLL over the target tokens, and their count.

    ``nll = sum_{(b,k): y_bk != -100} -log softmax(z_bk)[y_bk]``, computed in float32.

    Args:
        logits: (B, K, V) scores at the predicting positions.
        targets: (B, K) the token each position predicts, -100 where there is no loss.

    Returns:
        ``(nll_sum, n_targets)``: 0-dim tensors (float32, long).
    """
    nll = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return nll, (targets != IGNORE_INDEX).sum()


@cache
def _accepts_logits_to_keep(model_class: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def target_nll(model: Any, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Run a causal LM on a batch and sum the NLL of its target tokens.

    Only the positions that predict a target in some row go through the LM head
    (``logits_to_keep``, where the model takes it): with a large vocabulary the full
    (B, T, V) logits would dominate memory, and targets are a small share of tokens.

    Args:
        model: a Hugging Face causal LM.
        batch: :func:`collate` output on the model's device: ``input_ids``, ``labels``,
            ``attention_mask``, each (B, T).

    Returns:
        ``(nll_sum, n_targets)`` as from :func:`masked_nll`.
    """
    keep_arg = _accepts_logits_to_keep(type(model))
    # Position t predicts token t+1  -> y: (B, T-1)
    y = batch["labels"][:, 1:]
    pos = (y != IGNORE_INDEX).any(dim=0).nonzero().squeeze(-1)  # (K,)
    if pos.numel() == 0:
        zero = batch["input_ids"].new_zeros((), dtype=torch.float32)
        return zero, zero.long()
    kwargs = {"logits_to_keep": pos} if keep_arg else {}
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        use_cache=False,
        **kwargs,
    )
    logits = out.logits if keep_arg else out.logits[:, pos]  # (B, K, V)
    return masked_nll(logits, y[:, pos])


# --------------------------------------------------------------------------- checkpoints


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``output_dir/checkpoints``, or ``None``."""
    return CheckpointDir(output_dir, marker=_STATE).latest()


def _save_checkpoint(
    output_dir: Path, cfg: SFTConfig, model: Any, tokenizer: Any, opt: Any, sched: Any, run: dict
) -> Path:
    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # A human-readable copy of the position and history, not read back.
        (tmp / "trainer_state.json").write_text(json.dumps(run, indent=1))
        torch.save(
            {
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "rng": rng_state(),
                "run": run,
                "config": cfg.model_dump(),
            },
            tmp / _STATE,
        )

    return CheckpointDir(output_dir, marker=_STATE, keep_last=cfg.keep_last).save(
        run["step"], write
    )


def _resume_point(
    cfg: SFTConfig, out: Path, fingerprint: str
) -> tuple[Path | None, dict[str, Any] | None]:
    """The newest checkpoint and its trainer state, checked against this run, or Nones."""
    latest = latest_checkpoint(out)
    if latest is None:
        return None, None
    if not cfg.resume:
        raise ConfigError(
            f"{out} already holds checkpoints (newest {latest.name}); set resume=True to "
            "continue that run or choose another output_dir"
        )
    saved = load_resume_state(
        latest, _STATE, cfg.model_dump(), free=_FREE_ON_RESUME, map_location="cpu"
    )
    if saved["run"]["data_fingerprint"] != fingerprint:
        raise ConfigError(
            f"cannot resume from {latest}: the training rows differ from the ones it was "
            "trained on; pass the same data or use a new output_dir"
        )
    return latest, saved


def _clean_partial(output_dir: Path) -> None:
    # A process killed mid-save or mid-delete leaves `.tmp-*` / `.trash-*` directories.
    CheckpointDir(output_dir, marker=_STATE).clean_partial()
    for kind in ("tmp", "trash"):
        for p in output_dir.glob(f".{kind}-final-*"):
            shutil.rmtree(p, ignore_errors=True)


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def _evaluate(
    model: Any, examples: Sequence[Example], batch_size: int, pad_id: int, ctx: Any
) -> float:
    """Mean NLL per target token over the whole split: sum of NLL / number of targets."""
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0  # eval uses the micro-batch size: same memory as training
    for i in range(0, len(examples), batch_size):
        batch = {k: v.to(device) for k, v in collate(examples[i : i + batch_size], pad_id).items()}
        with ctx():
            nll, n = target_nll(model, batch)
        total += float(nll)
        count += int(n)
    model.train()
    return total / max(count, 1)


# --------------------------------------------------------------------------- training


def _load_data(
    cfg: SFTConfig,
    train_rows: Sequence[Example] | None,
    validation_rows: Sequence[Example] | None,
) -> tuple[list[Example], list[Example]]:
    if train_rows is not None:
        train_set = [_check_example(dict(e), f"train row {i}") for i, e in enumerate(train_rows)]
        val = [
            _check_example(dict(e), f"validation row {i}")
            for i, e in enumerate(validation_rows or [])
        ]
    elif cfg.data_dir is not None:
        data = Path(cfg.data_dir)
        if cfg.chat_template_kwargs is not None:
            _check_rendering(data, cfg.chat_template_kwargs)
        train_set = load_sft_jsonl(data / "train.jsonl")
        val_path = data / "validation.jsonl"
        val = load_sft_jsonl(val_path) if val_path.is_file() else []
    else:
        raise ConfigError("no training data: set SFTConfig.data_dir or pass train_rows to train()")
    if not train_set:
        raise ConfigError("the training split is empty")
    return train_set, val


def _check_rendering(data: Path, wanted: dict[str, Any]) -> None:
    """Refuse rows rendered with other chat template arguments than ``wanted``."""
    manifest = data / "manifest.json"
    if not manifest.is_file():
        raise ConfigError(
            f"{data} has no manifest.json recording its chat_template_kwargs; export the rows "
            "with bat_gym.sft.export_sft, or set SFTConfig.chat_template_kwargs=None"
        )
    # Exports made before the manifest recorded them used the template's defaults.
    recorded = json.loads(manifest.read_text(encoding="utf-8")).get("chat_template_kwargs", {})
    if recorded != wanted:
        raise ConfigError(
            f"{data} was rendered with chat_template_kwargs={recorded!r}, not {wanted!r}; "
            "export the rows again with the wanted arguments into a new directory"
        )


def _optimizer(model: Any, cfg: SFTConfig) -> torch.optim.Optimizer:
    # Decay matrices only: decaying norm gains and biases pulls them toward 0, not
    # toward a simpler function.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_eps,
    )


def _export_final(out: Path, model: Any, tokenizer: Any) -> Path:
    """Write the trained model and tokenizer to ``out/final`` (written aside, then renamed)."""
    final, tmp = out / "final", out / f".tmp-final-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    publish(tmp, final)
    return final


def _append_metrics(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def _truncate_metrics(path: Path, upto: int) -> None:
    # After a kill, the log may hold steps past the checkpoint we resume from; they
    # will be run again, so drop them.
    if path.is_file():
        keep = [ln for ln in path.read_text().splitlines() if json.loads(ln)["step"] <= upto]
        path.write_text("".join(ln + "\n" for ln in keep))


def _accumulate(
    model: Any,
    rows: Sequence[Example],
    micro_batch_size: int,
    n_targets: int,
    pad_id: int,
    ctx: Any,
) -> float:
    """Backpropagate the global-batch loss micro-batch by micro-batch; return its value.

    ``L = sum_mb nll_mb / |S|`` with ``|S| = n_targets`` counted over all ``rows``, so
    gradients add up to those of one pass over the whole global batch.
    """
    device = next(model.parameters()).device
    total = torch.zeros((), device=device)
    for i in range(0, len(rows), micro_batch_size):
        batch = collate(rows[i : i + micro_batch_size], pad_id)
        with ctx():
            nll, _ = target_nll(model, {k: v.to(device) for k, v in batch.items()})
        # L_mb = nll_mb / |S|  (the global count, not this micro-batch's)
        (nll / max(n_targets, 1)).backward()
        total += nll.detach()  # kept on the device: no sync per micro-batch
    return float(total) / max(n_targets, 1)


@dataclass
class _SFTRun:
    """What one call of :func:`train` holds: the data, the model and its optimizer."""

    cfg: SFTConfig
    out: Path
    train_set: list[Example]
    val_set: list[Example]
    device: torch.device
    use_bf16: bool
    model: Any
    tokenizer: Any
    pad_id: int
    opt: torch.optim.Optimizer
    sched: Any
    run: dict[str, Any]
    """The position and history, saved in each checkpoint (``step``, ``samples_seen``,
    ``epoch``, ``offset``, ``n_train``, ``data_fingerprint``, ``train_loss``, ``eval_loss``)."""

    def ctx(self) -> Any:
        """bf16 autocast when the run uses it, else a no-op context."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.use_bf16)


def train(
    cfg: SFTConfig,
    *,
    train_rows: Sequence[Example] | None = None,
    validation_rows: Sequence[Example] | None = None,
    stop_at: int | None = None,
) -> dict[str, Any]:
    """Fine-tune ``cfg.model`` on the target tokens of the SFT rows; resume if possible.

    Args:
        cfg: the run configuration.
        train_rows: tokenized rows (``input_ids``, ``labels``) instead of
            ``cfg.data_dir``; kept out of the config so that it stays JSON-sized. A
            resumed run must get the same rows (checked by fingerprint).
        validation_rows: rows for the validation loss, with ``train_rows``.
        stop_at: end this call after this global step, leaving a checkpoint, as a
            preempted job would; a later call with the same config continues.

    Returns:
        A summary: ``step`` reached, ``train_loss`` (one per step since step 1, resumed
        steps included), ``eval_loss`` (step -> loss), ``resumed_from`` (step or None),
        ``stopped_early``, ``final_dir`` (None when stopped early), ``device``,
        ``bf16``, ``seconds`` and ``seconds_per_step`` (this call).

    Raises:
        ValueError: no data, a checkpoint whose settings or data differ, or checkpoints
            present with ``resume=False``.
    """
    t0 = time.perf_counter()
    r, resumed_from = _start(cfg, train_rows, validation_rows)
    start_step = r.run["step"]
    # `stop_at` ends this call early, as a preemption would; the run's math is unchanged.
    end = min(cfg.max_steps, stop_at) if stop_at is not None else cfg.max_steps
    t_loop = time.perf_counter()
    while r.run["step"] < end:
        _step(r, end)

    # ---- boilerplate: export and summary ---------------------------------------------------
    loop_s = time.perf_counter() - t_loop
    steps_run = r.run["step"] - start_step
    stopped_early = r.run["step"] < cfg.max_steps
    final_dir = None if stopped_early else _export_final(r.out, r.model, r.tokenizer)
    summary = {
        "step": r.run["step"],
        "train_loss": list(r.run["train_loss"]),
        "eval_loss": {int(k): v for k, v in r.run["eval_loss"].items()},
        "resumed_from": resumed_from,
        "stopped_early": stopped_early,
        "final_dir": str(final_dir) if final_dir is not None else None,
        "device": str(r.device),
        "bf16": r.use_bf16,
        "global_batch_size": cfg.global_batch_size,
        "seconds": time.perf_counter() - t0,
        "seconds_per_step": loop_s / steps_run if steps_run else None,
    }
    (r.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _start(
    cfg: SFTConfig,
    train_rows: Sequence[Example] | None,
    validation_rows: Sequence[Example] | None,
) -> tuple[_SFTRun, int | None]:
    """Data, device, model and optimizer, restored from the newest checkpoint if any.

    Returns:
        The run, and the step it resumed from (None for a fresh run).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _clean_partial(out)
    train_set, val_set = _load_data(cfg, train_rows, validation_rows)
    fingerprint = _fingerprint(train_set)
    device = resolve_device(cfg.device)
    use_bf16 = resolve_bf16(cfg.bf16, device)
    latest, saved = _resume_point(cfg, out, fingerprint)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    source = str(latest) if latest is not None else cfg.model
    tokenizer = AutoTokenizer.from_pretrained(source)
    # fp32 master weights: bf16 weights would round away most 2e-5-sized updates.
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(device)
    set_activation_checkpointing(model, cfg.gradient_checkpointing)
    set_mlp_tiling(model, cfg.mlp_chunk_size)
    model.train()
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id or 0  # any id: padding is masked out of attention
    opt = _optimizer(model, cfg)
    sched = lr_scheduler(
        opt, warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps, schedule=cfg.lr_schedule
    )
    run: dict[str, Any] = {
        "step": 0,
        "samples_seen": 0,
        "epoch": 0,
        "offset": 0,
        "n_train": len(train_set),
        "data_fingerprint": fingerprint,
        "train_loss": [],
        "eval_loss": {},
    }
    r = _SFTRun(
        cfg, out, train_set, val_set, device, use_bf16, model, tokenizer, pad_id, opt, sched, run
    )
    if saved is not None:
        _restore(r, saved, latest)
    (out / "config.json").write_text(json.dumps(cfg.model_dump(), indent=1))
    return r, (r.run["step"] if saved is not None else None)


def _restore(r: _SFTRun, saved: dict[str, Any], latest: Path | None) -> None:
    """Continue from a checkpoint: optimizer, schedule, position and RNGs."""
    r.opt.load_state_dict(saved["optimizer"])
    r.sched.load_state_dict(saved["scheduler"])
    r.run = saved["run"]
    set_rng_state(saved["rng"])
    _truncate_metrics(r.out / "metrics.jsonl", r.run["step"])
    if saved["config"]["max_steps"] != r.cfg.max_steps and r.cfg.lr_schedule != "constant":
        log.warning(
            "max_steps changed from %d to %d: the lr schedule is stretched from step %d on",
            saved["config"]["max_steps"],
            r.cfg.max_steps,
            r.run["step"],
        )
    log.info("resuming from %s (step %d)", latest, r.run["step"])


def _step(r: _SFTRun, end: int) -> None:
    """One optimizer step over the global batch, then its metrics and checkpoint.

    Args:
        r: the run, advanced in place.
        end: the last step of this call (a checkpoint is written there).
    """
    cfg, run = r.cfg, r.run
    # ---- algorithm: one optimizer step over the global batch -----------------------
    indices = _batch_indices(len(r.train_set), cfg.seed, run["samples_seen"], cfg.global_batch_size)
    batch_rows = [r.train_set[i] for i in indices]
    # |S|: target tokens of the whole global batch, known before any forward pass
    n_targets = sum(_n_targets(e) for e in batch_rows)
    loss = _accumulate(r.model, batch_rows, cfg.micro_batch_size, n_targets, r.pad_id, r.ctx)
    lr = r.sched.get_last_lr()[0]
    clip = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
    params = [p for p in r.model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
    r.opt.step()
    r.sched.step()
    r.opt.zero_grad(set_to_none=True)

    # ---- boilerplate: bookkeeping, evaluation, checkpoints ---------------------------
    run["step"] += 1
    run["samples_seen"] += len(indices)
    run["epoch"], run["offset"] = divmod(run["samples_seen"], len(r.train_set))
    run["train_loss"].append(loss)
    step = run["step"]
    record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm}
    record["target_tokens"] = n_targets
    if r.val_set and (step == cfg.max_steps or (cfg.eval_every and step % cfg.eval_every == 0)):
        val = _evaluate(r.model, r.val_set, cfg.micro_batch_size, r.pad_id, r.ctx)
        run["eval_loss"][str(step)] = val
        record["eval_loss"] = val
    _append_metrics(r.out / "metrics.jsonl", record)
    if (cfg.log_every and step % cfg.log_every == 0) or step == cfg.max_steps:
        log.info("step %d loss %.4f lr %.3g grad_norm %.3g", step, loss, lr, grad_norm)
    if step == end or (cfg.save_every and step % cfg.save_every == 0):
        _save_checkpoint(r.out, cfg, r.model, r.tokenizer, r.opt, r.sched, run)
