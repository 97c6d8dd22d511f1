"""Unmodified data-parallel and pipeline-parallel jobs (gloo, 4 ranks under torchrun) with one rank, or one pipeline
stage, slower than the others, as a node with a slow GPU would make it. Nothing of goodput in them.

FRAMEWORK picks the parallelism: `ddp` (DistributedDataParallel), `fsdp2` (fully_shard), `pipeline` (two stages,
each of two data-parallel replicas, activations and gradients sent point to point with torch.distributed.pipelining's
GPipe schedule, the stages' gradients averaged across replicas), `hf` (a Hugging Face Trainer, which wraps the model
in DDP through accelerate) and `lightning` (a Lightning Trainer with its DDP strategy).

The model's work is simulated: a layer that takes FORWARD seconds in its forward pass and BACKWARD in its backward
pass (a sleep stands for the device's compute, so that the 2-core test machine's scheduling does not blur the ranks'
speeds), SLOW_FACTOR times as long on SLOW_RANK; STAGE_FACTOR times as long on every rank of the last pipeline stage
(imbalance by construction). The layer's real computation (small Linear layers) is left as it is.

The job times itself: the time each rank spends in its own work (forward passes, the simulated layer's backward,
optimizer steps), by perf_counter around each; the rest of its steps is waiting for its peers. The `ddp` job also
registers its own communication hook (DDP's averaging all-reduce, each bucket's launch and completion noted: the
exposed wait from the last launch to the last completion), which goodput-instrument must leave in place
(COMM_HOOK=0: DDP's built-in all-reduce). It writes its figures, losses and final parameters to
$OUT_DIR/<run>-rank-N.json. Fixed seeds. The `hf` job checkpoints every SAVE_STEPS steps into CHECKPOINT_DIR and, run
again, resumes from its last checkpoint there.
"""

import json
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

FRAMEWORK = os.environ.get("FRAMEWORK", "ddp")
STEPS = int(os.environ.get("STEPS", "30"))
FORWARD = float(os.environ.get("FORWARD", "0.02"))
BACKWARD = float(os.environ.get("BACKWARD", "0.005"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_FACTOR = float(os.environ.get("SLOW_FACTOR", "3"))
STAGE_FACTOR = float(os.environ.get("STAGE_FACTOR", "1"))
WIDTH = 32
BATCH = 16
OWN = {"work": 0.0, "steps": 0, "step_time": 0.0, "exposed_wait": 0.0, "losses": [], "hook_calls": 0}


class _Work(torch.autograd.Function):
    """The simulated device work: forward and backward take their set time; values pass through unchanged."""

    @staticmethod
    def forward(ctx, x, forward, backward):
        ctx.backward_seconds = backward
        _sleep(forward)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _sleep(ctx.backward_seconds)
        return grad, None, None


def _sleep(seconds: float) -> None:
    started = time.perf_counter()
    time.sleep(seconds)
    OWN["work"] += time.perf_counter() - started


class Block(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.forward_seconds, self.backward_seconds = FORWARD * factor, BACKWARD * factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(_Work.apply(self.linear(x), self.forward_seconds, self.backward_seconds))


def factor(rank: int, stage: int = 0, stages: int = 1) -> float:
    return (SLOW_FACTOR if rank == SLOW_RANK else 1.0) * (STAGE_FACTOR if stages > 1 and stage == stages - 1 else 1.0)


class Timing:
    """The job's own DDP communication hook: the averaging all-reduce, each bucket's launch and completion noted."""

    def __init__(self, world: int) -> None:
        self.world, self.launched, self.completed = world, [], []

    def hook(self, state, bucket):  # DDP refuses string annotations
        OWN["hook_calls"] += 1
        self.launched.append(time.perf_counter())
        future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

        def averaged(done):
            self.completed.append(time.perf_counter())
            return done.value()[0].div_(self.world)

        return future.then(averaged)

    def exposed(self) -> float:
        waited = max(0.0, max(self.completed) - max(self.launched)) if self.completed else 0.0
        self.launched.clear()
        self.completed.clear()
        return waited


def data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(BATCH, WIDTH, generator=generator), torch.randn(BATCH, 1, generator=generator)


def model_for(rank: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(Block(factor(rank)), Block(factor(rank)), torch.nn.Linear(WIDTH, 1))


def timed_step(optimizer: torch.optim.Optimizer) -> None:
    started = time.perf_counter()
    optimizer.step()
    OWN["work"] += time.perf_counter() - started


def train_loop(model: torch.nn.Module, rank: int, exposed: Callable[[], float] | None = None) -> torch.nn.Module:
    """The plain loop of the DDP and FSDP2 jobs: SGD, each step timed; `exposed`: the step's exposed wait, as the job's
    own comm hook measured it."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(STEPS):
        started = time.perf_counter()
        x, y = data(rank, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        timed_step(optimizer)
        if exposed is not None:
            OWN["exposed_wait"] += exposed()
        OWN["losses"].append(loss.item())
        OWN["step_time"] += time.perf_counter() - started
    return model


def train_ddp(rank: int, world: int) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(model_for(rank))
    timing = Timing(world)
    if os.environ.get("COMM_HOOK", "1") != "0":
        model.register_comm_hook(None, timing.hook)
    return train_loop(model, rank, timing.exposed)


def train_fsdp2(rank: int, world: int) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = model_for(rank)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    return train_loop(model, rank)


def train_pipeline(rank: int, world: int) -> torch.nn.Module:
    """Two stages, each with two replicas: pipeline p = rank // 2 holds ranks (2p, 2p + 1), stage = rank % 2."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stages, stage = 2, rank % 2
    pipelines = [dist.new_group([2 * p, 2 * p + 1]) for p in range(world // stages)]
    replicas = [dist.new_group(list(range(s, world, stages))) for s in range(stages)]
    torch.manual_seed(stage)
    blocks = [Block(factor(rank, stage, stages)), Block(factor(rank, stage, stages))]
    module = torch.nn.Sequential(*blocks, *([torch.nn.Linear(WIDTH, 1)] if stage == stages - 1 else []))
    pipe = PipelineStage(module, stage, stages, torch.device("cpu"), group=pipelines[rank // stages])
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-2)
    losses: list[torch.Tensor] = []
    schedule = ScheduleGPipe(pipe, n_microbatches=2,
                             loss_fn=lambda out, target: torch.nn.functional.mse_loss(out, target))
    for step in range(STEPS):
        started = time.perf_counter()
        x, y = data(rank // stages, step)
        optimizer.zero_grad()
        losses.clear()
        if stage == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        for parameter in module.parameters():  # the replicas of this stage average their gradients
            dist.all_reduce(parameter.grad, group=replicas[stage])
            parameter.grad.div_(world // stages)
        timed_step(optimizer)
        OWN["losses"].append(sum(loss.item() for loss in losses))
        OWN["step_time"] += time.perf_counter() - started
    return module


class Records(torch.utils.data.Dataset):
    """The rank's batches, as the frameworks' samplers hand them out (each rank its own share)."""

    def __len__(self) -> int:
        return STEPS * BATCH * int(os.environ.get("WORLD_SIZE", "1"))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x, y = data(index, 0)
        return {"x": x[0], "labels": y[0]}


class Regression(torch.nn.Module):
    """The model as a Hugging Face Trainer takes it: the loss in its output."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.net = model_for(rank)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}


def train_hf(rank: int, world: int) -> torch.nn.Module:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Steps(TrainerCallback):  # the whole training loop: the Trainer's own collectives (its loss logging) too
        started = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_train_end(self, args, state, control, **kwargs):
            OWN["step_time"] += time.perf_counter() - self.started

    model = Regression(rank)
    # SAVE_STEPS: a checkpoint every that many steps, into CHECKPOINT_DIR (shared by the job's runs); a run that finds
    # one there resumes from the last
    output = os.environ.get("CHECKPOINT_DIR") or os.path.join(os.environ["OUT_DIR"], "hf")
    save = int(os.environ.get("SAVE_STEPS", "0"))
    args = TrainingArguments(
        output_dir=output, per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=1e-2,
        lr_scheduler_type="constant", optim="sgd", save_strategy="steps" if save else "no", save_steps=save or 500,
        logging_steps=1, report_to=[], use_cpu=True, seed=0, data_seed=0, dataloader_num_workers=0,
        disable_tqdm=True, max_grad_norm=0.0)
    trainer = Trainer(model=model, args=args, train_dataset=Records(), callbacks=[Steps()])
    resume = save > 0 and os.path.isdir(output) and any(n.startswith("checkpoint-") for n in os.listdir(output))
    trainer.train(resume_from_checkpoint=resume or None)
    OWN["losses"] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return model


def train_lightning(rank: int, world: int) -> torch.nn.Module:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model_for(rank)

        def training_step(self, batch, index):
            loss = torch.nn.functional.mse_loss(self.net(batch["x"]), batch["labels"])
            OWN["losses"].append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    class Steps(L.Callback):
        started = 0.0

        def on_train_batch_start(self, *args):
            self.started = time.perf_counter()

        def on_train_batch_end(self, *args):
            OWN["step_time"] += time.perf_counter() - self.started

    module = Module()
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy="ddp", max_steps=STEPS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Steps()], num_sanity_val_steps=0)
    trainer.fit(module, torch.utils.data.DataLoader(Records(), batch_size=BATCH))
    return module


def main() -> None:
    trains = {"ddp": train_ddp, "fsdp2": train_fsdp2, "pipeline": train_pipeline, "hf": train_hf,
              "lightning": train_lightning}
    if FRAMEWORK in ("hf", "lightning"):  # the framework sets up the process group
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        model = trains[FRAMEWORK](rank, world)
    else:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = trains[FRAMEWORK](rank, world)
    OWN["steps"] = STEPS
    OWN["params"] = [p.detach().full_tensor().flatten().tolist() if hasattr(p, "full_tensor")
                     else p.detach().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(os.environ["OUT_DIR"], f"{os.environ.get('RUN_NAME', 'run')}-rank-{rank}.json"),
              "w") as file:
        json.dump(OWN, file)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
