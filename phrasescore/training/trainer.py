"""The training loop both ``train`` and ``train-lm`` run: data, optimiser, validation, early
stopping, checkpoints, exact resume.

Objective (Cho et al. 2014, eq. 3): maximise the mean conditional log-likelihood of the target
tokens (EOS included), i.e. minimise the summed token NLL divided by the number of target tokens
of the batch. With ``--self-normalize α`` (``ModelConfig.self_normalize``) every target token also
adds α (log Z)², log Z being the log of the softmax's normaliser at that step (Devlin et al. 2014,
§2.1), divided by the same number; perplexities (train and validation) are those of the NLL alone,
and validation also logs the mean |log Z|. Batches hold pairs of similar length within a token
budget (or a fixed number of pairs for ``--preset paper``, as the paper's minibatches of 64).

Files written next to the model ``MODEL``:

``MODEL``              the model: the best of the run (lowest validation perplexity), a
                       safetensors file, put there when the run ends or is interrupted
``MODEL.best``         the best model so far while the run goes on (renamed to ``MODEL`` at the
                       end; kept with the checkpoint when a run fails, for ``--resume``)
``MODEL.checkpoint``   the full training state (weights, optimiser, RNG, position in the epoch)
                       with the run's identity and a checksum (:mod:`.checkpoint_file`,
                       :mod:`.run_identity`), written every ``checkpoint_every`` steps, on Ctrl-C and
                       at the end; ``--resume`` continues from it exactly (same weights as an
                       uninterrupted run), and only the same run: other data or flags are
                       refused in one line
``MODEL.log``          the training log
``MODEL.curve.png``    train/validation perplexity against steps

A run that fails (a full disk, bad data) leaves nothing under ``MODEL``; what it wrote beside it
is removed unless it saved a checkpoint to ``--resume`` from.

Under torchrun (``WORLD_SIZE`` = W > 1) one model is trained with DistributedDataParallel. Every
rank builds the same seeded epoch plan of token-budget batches and takes every W-th batch from
its rank on (rank r: batches r, r+W, r+2W, ...), so an epoch's pairs are each seen once; all
ranks make ceil(batches / W) steps, and a rank whose last round has no batch left repeats one
with weight 0. A step's gradient is that of the W batches together (token NLL summed over the
ranks, divided by the global number of target tokens), so ``--batch-tokens`` is per rank and a
step sees about W times as many. Rank 0 alone validates, logs, writes the model and
checkpoints; the others wait. A checkpoint records W and every rank's random state, and
``--resume`` needs the same W.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from phrasescore import __version__
from phrasescore.bundle import TrainedModel, save_model
from phrasescore.errors import InputError
from phrasescore.files import output_lock
from phrasescore.hardware import deterministic_kernels
from phrasescore.model import build_network
from phrasescore.model.config import ModelConfig, TrainConfig
from phrasescore.progress import progress_bar
from phrasescore.runners import distributed
from phrasescore.text.corpus import TokenBudgetBatcher
from phrasescore.training import checkpoint_file
from phrasescore.training.captured_step import CapturedTrainingStep
from phrasescore.training.data import TrainingData, prepare_data, unigram_perplexity
from phrasescore.training.loop import TrainingLoop, make_optimizer
from phrasescore.training.run_identity import BUDGETS, identity_difference, make_run_identity
from phrasescore.training.run_log import TrainingLogFile, quiet_handlers
from phrasescore.training.run_state import Position, RunState
from phrasescore.training.validation import Validating

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    model_path: str
    signature: str
    steps: int
    epochs_done: float
    best_valid_ppl: float
    unigram_valid_ppl: float
    stopped: str
    history: list[dict[str, Any]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What ``train`` and ``train-lm`` print on standard output: one tab-separated line."""
        return [
            f"{self.model_path}\tvalid_ppl={self.best_valid_ppl:.2f}\t"
            f"unigram_ppl={self.unigram_valid_ppl:.1f}\tsteps={self.steps}\t"
            f"signature={self.signature}"
        ]


class Trainer(TrainingLoop, Validating):
    """Runs (or resumes) one training run; see the module docstring for the files it writes."""

    def __init__(
        self,
        model_path: str,
        data: TrainingData,
        mcfg: ModelConfig,
        tcfg: TrainConfig,
        device: torch.device,
        preset: str = "default",
        amp: bool = False,
        progress: bool = True,
        launch: distributed.Launch | None = None,
    ):
        self.launch = launch
        self.world = launch.world_size if launch else 1
        self.is_main = launch is None or launch.is_main
        self.model_path = model_path
        self.data = data
        self.mcfg = mcfg
        self.tcfg = tcfg
        self.device = device
        self.preset = preset
        self.amp = amp
        self.progress = progress and self.is_main
        self.checkpoint_path = model_path + ".checkpoint"
        self.best_path = model_path + ".best"
        self.log_path = model_path + ".log"
        self.curve_path = model_path + ".curve.png"
        self.recipe: dict[str, Any] = {}
        self.checkpointed = False
        """Whether this run saved a checkpoint (a failed run then keeps its files)."""

    # ------------------------------------------------------------------ what is trained
    # Hooks that a trainer of another kind of network overrides (training.lm_trainer.LMTrainer).
    config_class = ModelConfig

    def prepare(self, tcfg: TrainConfig, vocab_states):
        """(src_text, tgt_text, src_vocab, tgt_vocab, train, valid); see :func:`prepare_data`."""
        return prepare_data(self.data, tcfg, vocab_states, self.mcfg)

    def new_network(self, src_vocab, tgt_vocab) -> torch.nn.Module:
        self.mcfg.src_vocab_size = len(src_vocab)
        self.mcfg.tgt_vocab_size = len(tgt_vocab)
        return build_network(self.mcfg)

    def write_model(self, network, texts, vocabs, info: dict[str, Any]) -> str:
        """Save the best network so far to ``best_path``; returns its signature."""
        return save_model(
            self.best_path,
            TrainedModel(
                network=network,
                src_vocab=vocabs[0],
                tgt_vocab=vocabs[1],
                src_text=texts[0],
                tgt_text=texts[1],
                info=info,
            ),
        )

    def read_signature(self) -> str:
        """The signature of the model file saved earlier (e.g. by the run resumed)."""
        from phrasescore.bundle import read_metadata

        return read_metadata(self.model_path)["signature"]

    def make_recipe(self) -> dict[str, Any]:
        """What this run is made of (:mod:`.run_identity`), before any resume."""
        return make_run_identity(
            self.data.files(),
            self.data.flags(),
            self.preset,
            self.mcfg.to_dict(),
            self.tcfg.to_dict(),
        )

    # ------------------------------------------------------------------ state
    def _checkpoint_state(self, network, optimizer, position, vocab_states) -> dict[str, Any]:
        meta = {
            "position": position.to_dict(),
            "model_config": self.mcfg.to_dict(),
            "train_config": self.tcfg.to_dict(),
            "data": self.data.describe(),
            "preset": self.preset,
            "vocab": vocab_states,
            "version": __version__,
            "recipe": self.recipe,
        }
        state = {
            "network": network.state_dict(),
            "optimizer": optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.device.type == "cuda" and self.launch is None:
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)  # dropout's on the GPU
        if self.launch is not None:
            meta["world_size"] = self.world
            state["rank_rng"] = torch.stack(distributed.all_gather_rng_states())
        state["meta"] = json.dumps(meta)
        return state

    def _save_checkpoint(self, network, optimizer, position, vocab_states) -> None:
        """Every rank calls this (the random states are gathered); rank 0 writes."""
        state = self._checkpoint_state(network, optimizer, position, vocab_states)
        if not self.is_main:
            return
        checkpoint_file.write_checkpoint(self.checkpoint_path, state)
        self.checkpointed = True

    @staticmethod
    def read_checkpoint(path: str) -> dict[str, Any]:
        """The checkpoint at ``path``, checked (:func:`.checkpoint_file.read_checkpoint`)."""
        if not os.path.exists(path):
            raise InputError("no checkpoint to resume from", path)
        return checkpoint_file.read_checkpoint(path)

    def _publish(self) -> None:
        """The best model of the run under its final name (rank 0)."""
        if self.is_main and os.path.exists(self.best_path):
            os.replace(self.best_path, self.model_path)

    def _remove_failed_run(self, resume: bool) -> None:
        """After a failure, what this fresh run wrote beside the model, unless it saved a
        checkpoint to resume from (then all is kept for ``--resume``)."""
        if resume or self.checkpointed or not self.is_main:
            if self.checkpointed:
                log.warning(
                    "the last checkpoint is kept: rerun with --resume once the cause is fixed"
                )
            return
        for path in (self.best_path, self.curve_path, self.log_path):
            if os.path.isfile(path):
                os.unlink(path)

    # ------------------------------------------------------------------ run
    def run(self, resume: bool = False) -> TrainResult:
        if not self.is_main:  # rank 0 alone logs
            quiet = logging.getLogger("phrasescore")
            level = quiet.level
            quiet.setLevel(logging.WARNING)
            try:
                return self._run(resume)
            finally:
                quiet.setLevel(level)
        # made at its first record (a resume refused at once leaves none)
        file_log = TrainingLogFile(self.log_path, mode="a" if resume else "w", delay=True)
        file_log.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        root = logging.getLogger("phrasescore")
        root.addHandler(file_log)
        failed = True
        try:
            with quiet_handlers(root):
                result = self._run(resume)
            failed = False
            return result
        except KeyboardInterrupt:
            failed = False  # the checkpoint is saved: --resume goes on
            raise
        finally:
            root.removeHandler(file_log)
            file_log.close()
            if failed:
                self._remove_failed_run(resume)

    def _run(self, resume: bool) -> TrainResult:
        self.recipe = self.make_recipe()
        if resume and not os.path.exists(self.checkpoint_path):
            log.info(
                "nothing to resume: no checkpoint %s yet; training from the beginning",
                self.checkpoint_path,
            )
            resume = False
        ckpt = self.read_checkpoint(self.checkpoint_path) if resume else None
        if ckpt is not None:
            saved_world = ckpt["meta"].get("world_size", 1)
            if saved_world != self.world:
                how = "without torchrun" if saved_world == 1 else f"with {saved_world} processes"
                raise InputError(
                    f"cannot resume with {self.world} process(es): the checkpoint was written "
                    f"{how} (resume with the same torchrun --nproc-per-node x --nnodes)",
                    self.checkpoint_path,
                )
            self._check_recipe(ckpt["meta"])
            self._restore_configs(ckpt["meta"])
        run = self._start(ckpt)
        bar = progress_bar(
            self.progress, total=self.tcfg.max_steps, initial=run.position.step, unit="step"
        )
        try:
            stopped = self._train(run, bar)
        except KeyboardInterrupt:
            if self.launch is not None:  # other ranks may be gone: no collective now
                log.warning("interrupted; continue from the last checkpoint with --resume")
                raise
            run.position.elapsed = time.monotonic() - run.started
            self._save_checkpoint(run.network, run.optimizer, run.position, run.vocab_states)
            self._publish()
            log.warning(
                "interrupted at step %s; checkpoint saved, continue with --resume",
                f"{run.position.step:,}",
            )
            raise
        finally:
            bar.close()
        return self._finish(run, stopped)

    def _check_recipe(self, meta: dict[str, Any]) -> None:
        """Refuse to resume a checkpoint of other data or flags (:func:`identity_difference`)."""
        saved = meta.get("recipe")
        if saved is None:
            log.warning(
                "%s was written before checkpoints recorded their data and flags: they cannot "
                "be checked against this run's",
                self.checkpoint_path,
            )
            return
        difference = identity_difference(saved, self.recipe, self.checkpoint_path)
        if difference:
            raise InputError(
                f"{difference} (resume with the data and flags of the run, or train without "
                "--resume to start again)"
            )

    def _restore_configs(self, meta: dict[str, Any]) -> None:
        """The configuration of the run resumed; only the budgets may be changed on resume."""
        self.mcfg = self.config_class.from_dict(meta["model_config"])
        saved = TrainConfig.from_dict(meta["train_config"])
        for key in BUDGETS:
            setattr(saved, key, getattr(self.tcfg, key))
        self.tcfg = saved
        self.preset = meta["preset"]
        position = Position.from_dict(meta["position"])
        best = position.best
        log.info(
            "resuming at step %s of %s (epoch %d%s)",
            f"{position.step:,}",
            self.checkpoint_path,
            position.epoch + 1,
            f", best validation perplexity {best:.2f}" if math.isfinite(best) else "",
        )

    def _start(self, ckpt: dict[str, Any] | None) -> RunState:
        """Data, network, optimiser and position: fresh, or those of the checkpoint."""
        tcfg = self.tcfg
        deterministic_kernels(self.device)
        torch.manual_seed(tcfg.seed)
        src_text, tgt_text, src_vocab, tgt_vocab, train, valid = self.prepare(
            tcfg, ckpt["meta"]["vocab"] if ckpt else None
        )
        network = self.new_network(src_vocab, tgt_vocab).to(self.device)
        if tcfg.compile:
            network.compile_steps()
        network.chunked_output = tcfg.chunked_output
        optimizer = make_optimizer(network, tcfg)
        position = Position()
        if self.launch is not None and self.launch.rank:
            torch.manual_seed(tcfg.seed + self.launch.rank)  # other dropout masks on each rank
        if ckpt is not None:
            try:
                network.load_state_dict(ckpt["network"])
                optimizer.load_state_dict(ckpt["optimizer"])
            except (RuntimeError, ValueError, KeyError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise InputError(
                    f"the checkpoint does not fit this run's network ({first})",
                    self.checkpoint_path,
                ) from None
            if self.launch is not None:
                torch.set_rng_state(ckpt["rank_rng"][self.launch.rank].clone())  # no view
            else:
                torch.set_rng_state(ckpt["torch_rng"])
                if "cuda_rng" in ckpt and self.device.type == "cuda":
                    torch.cuda.set_rng_state(ckpt["cuda_rng"], self.device)
            position.update(ckpt["meta"]["position"])
        unigram = unigram_perplexity(train, valid, len(tgt_vocab))
        log.info(
            "training %s (%s preset, %d parameters) on %d pairs, validating on %d; "
            "unigram validation perplexity %.1f",
            self.mcfg.arch,
            self.preset,
            sum(p.numel() for p in network.parameters()),
            len(train),
            len(valid),
            unigram,
        )
        batcher = TokenBudgetBatcher(
            train, tcfg.batch_tokens, shuffle=True, seed=tcfg.seed, max_pairs=tcfg.batch_pairs
        )
        network.train()
        captured_step = None
        if tcfg.graphs and self.launch is None:
            captured_step = CapturedTrainingStep(
                network, self.device, self.amp, tcfg.clip_norm, tcfg.loss_per_sentence
            )
            log.info("--graphs: each batch shape's forward and backward captured in a CUDA graph")
        loss = network.loss_terms
        if self.launch is not None:
            loss = distributed.data_parallel_loss(network, self.device)
            log.info(
                "torchrun: %d processes, each --batch-tokens %d: a step sees about %d target "
                "tokens (the global batch), %d steps per epoch",
                self.world,
                tcfg.batch_tokens,
                self.world * tcfg.batch_tokens,
                self._steps_per_epoch(batcher, 0),
            )
        return RunState(
            loss=loss,
            network=network,
            params=list(network.parameters()),
            optimizer=optimizer,
            train=train,
            valid=valid,
            batcher=batcher,
            texts=(src_text, tgt_text),
            vocabs=(src_vocab, tgt_vocab),
            vocab_states=[src_vocab.to_state(), tgt_vocab.to_state()],
            unigram=unigram,
            position=position,
            captured_step=captured_step,
            started=time.monotonic() - position.elapsed,
            tick=time.monotonic(),
        )

    def _finish(self, run: RunState, stopped: str) -> TrainResult:
        """The last validation and checkpoint, and the result."""
        position = run.position
        position.elapsed = time.monotonic() - run.started
        if self._window_tokens(run) or not position.history:
            run.signature = self._validate(run, scheduled=False)
        nothing = not (os.path.exists(self.best_path) or os.path.exists(self.model_path))
        if self.launch is not None:
            nothing = distributed.from_main(nothing)
        if nothing:  # e.g. --lr 1e10: no checkpoint of it either
            raise InputError(
                "no validation perplexity was finite (the training diverged): no model written; "
                "try a smaller --lr",
                self.model_path,
            )
        self._save_checkpoint(run.network, run.optimizer, position, run.vocab_states)
        self._publish()
        distributed.barrier()
        signature = run.signature or self.read_signature()
        steps = max(self._steps_per_epoch(run.batcher, 0), 1)
        epochs_done = position.epoch + position.batch / steps
        log.info(
            "stopped (%s) after %d steps, %.2f epochs, %.0f s; best validation perplexity %.2f "
            "(unigram %.1f); model %s (signature %s)",
            stopped,
            position.step,
            epochs_done,
            position.elapsed,
            position.best,
            run.unigram,
            self.model_path,
            signature,
        )
        return TrainResult(
            model_path=self.model_path,
            signature=signature,
            steps=position.step,
            epochs_done=epochs_done,
            best_valid_ppl=position.best,
            unigram_valid_ppl=run.unigram,
            stopped=stopped,
            history=position.history,
        )


def training_outputs(model_path: str) -> dict[str, str]:
    """The files a training writes, by option: the model and, beside it, the best model so far
    (renamed onto the model at the end), its checkpoint, log and curve (:class:`Trainer`; the
    lock, :func:`~phrasescore.files.with_locks`)."""
    return {
        "-o": model_path,
        "-o's best model": model_path + ".best",
        "-o's checkpoint": model_path + ".checkpoint",
        "-o's log": model_path + ".log",
        "-o's curve": model_path + ".curve.png",
    }


def training_lock(model_path: str):
    """:func:`~phrasescore.files.output_lock` of the model, taken by the one process that
    writes it (rank 0 under torchrun): a second training onto the same model at the same time
    is refused in one line naming the process that holds it."""
    launch = distributed.from_env()
    if launch is not None and not launch.is_main:
        return contextlib.nullcontext()
    return output_lock(model_path)


def train_to_end(
    trainer_class, model_path, data, mcfg, tcfg, dev, *, preset, amp, progress, launch, resume
) -> TrainResult:
    """Build ``trainer_class`` (:class:`Trainer` or a subclass), run it to the end (from its
    checkpoint with ``resume``) and leave the torchrun process group, whatever happens."""
    use_amp = dev.type == "cuda" if amp is None else amp
    trainer = trainer_class(
        model_path,
        data,
        mcfg,
        tcfg,
        dev,
        preset=preset,
        amp=use_amp,
        progress=progress,
        launch=launch,
    )
    try:
        return trainer.run(resume=resume)
    finally:
        distributed.shutdown()


def apply_overrides(tcfg: TrainConfig, overrides: dict | None) -> None:
    """Set the :class:`TrainConfig` fields of ``overrides`` that are not None."""
    for key, value in (overrides or {}).items():
        if value is not None:
            setattr(tcfg, key, value)
