"""A small but real post-training loop: policy, sampler and reward processor as three groups.

The task is a contextual bandit: a prompt is a 4-dimensional vector, the policy picks one of 4
actions, and the reward processor pays 1 when the action matches a hidden rule. Each step:

1. the policy broadcasts its weights to the sampler group over a collective group (worker to
   worker, never through the driver), and the sampler samples one action per prompt;
2. the CPU processor group scores the rollouts;
3. the policy group (2 data-parallel ranks) takes a REINFORCE step, all-reducing gradients
   with torch.distributed inside the group.

The same file runs in every mode; only `--mode` changes:

    python examples/rl_pipeline.py --mode inprocess
    torchrun --standalone --nproc_per_node=2 examples/rl_pipeline.py --mode local
    python examples/rl_pipeline.py --mode ray

`--chaos` kills a worker halfway through the run, and the run ends with the losses of an
uninterrupted run (docs/restarts.md):
- on Ray, a sampler worker is SIGKILLed: the sampler group restarts
  (`DeviceGroup(max_restarts=1)`), the restarted sampler reloads the weights it last received
  in `on_restart`, the weights group is formed again, and the step's rollouts are asked again;
- under torchrun, process 1 exits: torchrun (`--max-restarts=1`) starts the whole job again,
  which resumes from the checkpoint the policy saves after every step (`--checkpoint-dir`):

      torchrun --standalone --nproc_per_node=2 --max-restarts=1 examples/rl_pipeline.py \
          --mode local --chaos --checkpoint-dir /tmp/rl-ckpt

`--sync handoff` moves the weights with `sampler.load_weights(policy.get_weights())` instead (a
LazyCollect hand-off: worker to worker through the object store on Ray, exchanged among the
processes under torchrun), and `--ballast-mib N` adds N MiB of extra weights to both nets (synced,
unused), to measure the two paths (docs/data.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist

from twinkle_core import (
    DeviceGroup,
    WorkerDiedError,
    collective,
    collective_group,
    get_device_placement,
    get_worker_context,
    init_distributed,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

N_FEATURES, N_ACTIONS = 4, 4
#: The collective group of the policy's and the sampler's workers (weights go through it).
WEIGHTS = "weights"


def build_net(ballast_mib: int = 0) -> torch.nn.Module:
    net = torch.nn.Linear(N_FEATURES, N_ACTIONS)
    if ballast_mib:  # stands in for a larger model when measuring the weight sync
        net.register_buffer("ballast", torch.zeros(ballast_mib * 2**18))
    return net


def weight_tensors(net: torch.nn.Module) -> list:
    """The net's weights in a fixed order; they share storage with the net, so a collective
    writing into them loads the net."""
    return list(net.state_dict().values())


def data_parallel_world() -> int:
    """How many processes share this worker's gradients (1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


@remote_class()
class Policy:
    """The trained model: data parallel, gradients all-reduced inside the group."""

    def __init__(self, lr: float, ballast_mib: int = 0) -> None:
        ctx = get_worker_context()
        if ctx.world_size > 1:
            # The same call in every mode: on Ray each group is its own torch.distributed world
            # (made here, gloo for a cpu group); under torchrun it already exists (False).
            init_distributed()
        self.net = build_net(ballast_mib)  # same seed in every worker: identical weights
        self.opt = torch.optim.SGD(self.net.parameters(), lr=lr)

    @remote_function(dispatch="all", execute="first", collect="first")
    def get_weights(self) -> dict:
        return {k: v.detach().numpy().copy() for k, v in self.net.state_dict().items()}

    @remote_function(dispatch="all", collect="none")
    def send_weights(self) -> None:
        """Broadcast rank 0's weights to every member of the weights group (the other policy
        ranks take part and receive the same values they already hold)."""
        collective(WEIGHTS).broadcast(weight_tensors(self.net), src=0)

    @remote_function(dispatch="all", execute="first", collect="first")
    def save_checkpoint(self, path: str, driver_state: dict) -> None:
        """The policy's weights and optimizer state with the driver's own state (the steps
        done), in one file written whole (`os.replace`): a job killed while writing keeps the
        previous checkpoint, never half of one."""
        state = {"net": self.net.state_dict(), "opt": self.opt.state_dict(), **driver_state}
        torch.save(state, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)

    @remote_function(dispatch="all", collect="none")
    def load_checkpoint(self, path: str) -> None:
        state = torch.load(path, weights_only=False)
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])

    @remote_function(dispatch="slice_dp", collect="mean")
    def train_step(self, batch: dict) -> float:
        # np.array copies: arrays from Ray's object store are read-only views.
        states = torch.as_tensor(np.array(batch["states"]), dtype=torch.float32)
        actions = torch.as_tensor(np.array(batch["actions"]))
        advantages = torch.as_tensor(np.array(batch["advantages"]), dtype=torch.float32)
        logp = torch.log_softmax(self.net(states), dim=-1)
        loss = -(advantages * logp[torch.arange(len(actions)), actions]).mean()
        self.opt.zero_grad()
        loss.backward()
        world = data_parallel_world()
        if world > 1:
            for p in self.net.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= world
        self.opt.step()
        return float(loss.detach())


@remote_class()
class Reference:
    """The frozen initial policy, colocated with the policy on its group (the same processes,
    one per rank): log-probabilities of the sampled actions, for a KL term."""

    def __init__(self, ballast_mib: int = 0) -> None:
        self.net = build_net(ballast_mib)  # built as a fresh worker: the policy's first weights

    @remote_function(dispatch="slice_dp", collect="mean")
    def log_probs(self, batch: dict) -> float:
        states = torch.as_tensor(np.array(batch["states"]), dtype=torch.float32)
        actions = torch.as_tensor(np.array(batch["actions"]))
        with torch.no_grad():
            logp = torch.log_softmax(self.net(states), dim=-1)
        return float(logp[torch.arange(len(actions)), actions].mean())


@remote_class()
class Sampler:
    """Generates rollouts from the latest policy weights."""

    def __init__(self, ballast_mib: int = 0, checkpoint_dir: str | None = None) -> None:
        self.net = build_net(ballast_mib)
        #: Where each rank keeps the weights it last received (None: nowhere).
        self.checkpoint_dir = checkpoint_dir

    @remote_function(dispatch="all", collect="none")
    def receive_weights(self) -> None:
        """Take the policy's weights from the weights group, in place."""
        collective(WEIGHTS).broadcast(weight_tensors(self.net), src=0)
        self._save()

    @remote_function(dispatch="all", collect="none")
    def load_weights(self, weights: dict) -> None:
        self.net.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in weights.items()})
        self._save()

    def _checkpoint(self) -> str:
        return os.path.join(self.checkpoint_dir, f"sampler-rank{get_worker_context().rank}.pt")

    def _save(self) -> None:
        if self.checkpoint_dir is not None:
            torch.save(self.net.state_dict(), self._checkpoint())

    def on_restart(self, generation: int) -> None:
        """Called by twinkle on every rank of a restarted sampler group, before it takes calls:
        back to the weights this rank last received (its constructor built fresh ones)."""
        if self.checkpoint_dir is not None and os.path.exists(self._checkpoint()):
            self.net.load_state_dict(torch.load(self._checkpoint()))

    @remote_function(dispatch="slice", collect="flatten")
    def generate(self, prompts: list, step: int) -> list:
        out = []
        with torch.no_grad():
            for prompt_id, state in prompts:
                # One generator per prompt: rollouts do not depend on how prompts are split.
                gen = torch.Generator().manual_seed(step * 100_003 + prompt_id)
                probs = torch.softmax(self.net(torch.as_tensor(np.array(state))), dim=-1)
                action = int(torch.multinomial(probs, 1, generator=gen))
                out.append((prompt_id, state, action))
        return out


@remote_class()
class RewardProcessor:
    """CPU-only reward computation."""

    def __init__(self, seed: int) -> None:
        self.rule = np.random.default_rng(seed).normal(size=(N_FEATURES, N_ACTIONS))

    @remote_function(dispatch="slice", collect="flatten")
    def score(self, rollouts: list) -> list:
        return [
            (pid, state, action, float(np.argmax(np.asarray(state) @ self.rule) == action))
            for pid, state, action in rollouts
        ]


def make_prompts(step: int, n: int) -> list:
    rng = np.random.default_rng(10_000 + step)
    return [(step * n + i, rng.normal(size=N_FEATURES).astype(np.float32)) for i in range(n)]


def is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def kill_a_worker(group: str, rank: int) -> int:
    """SIGKILL worker `rank` of `group`, found in the placement table as a user would."""
    text = get_device_placement(detail=True)
    block = text.split(f"group {group} ", 1)[1]
    line = next(li for li in block.splitlines() if re.search(rf"\brank {rank}\b.*\bnode", li))
    pid = int(re.search(r"process pid (\d+)", line).group(1))
    os.kill(pid, signal.SIGKILL)
    return pid


def sample(sampler: Sampler, prompts: list, step: int, retry: bool) -> object:
    """The step's rollouts; with `retry`, a call that met a dying sampler worker is made again
    (it runs on the restarted group, brought up to date by `on_restart`)."""
    rollouts = sampler.generate(prompts, step)
    if not retry:
        return rollouts
    for _attempt in range(3):
        try:
            rollouts()
            return rollouts
        except WorkerDiedError as exc:
            print(
                f"step {step:2d}  rollouts lost ({str(exc).splitlines()[0][:100]}...)", flush=True
            )
            rollouts = sampler.generate(prompts, step)
    return rollouts


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", default=os.environ.get("TWINKLE_MODE", "inprocess"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--notifier", default=None, help="e.g. 'dingtalk' (configured from env)")
    parser.add_argument("--out", default=None, help="write the per-step table here as JSON")
    parser.add_argument(
        "--sync",
        choices=("collective", "handoff"),
        default="collective",
        help="how weights reach the sampler: a collective group, or a LazyCollect hand-off",
    )
    parser.add_argument("--ballast-mib", type=int, default=0, help="extra MiB of weights")
    parser.add_argument(
        "--chaos",
        action="store_true",
        help="kill a worker halfway (ray: a sampler worker, restarted by twinkle; local: "
        "process 1, restarted by torchrun --max-restarts with --checkpoint-dir)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save the policy after every step here, and resume from it when present",
    )
    args = parser.parse_args(argv)
    if args.chaos and args.mode not in ("ray", "local"):
        parser.error("--chaos needs --mode ray or --mode local: in-process has no worker to kill")
    if args.chaos and args.mode == "local" and not args.checkpoint_dir:
        parser.error("--chaos under torchrun needs --checkpoint-dir to resume from")
    # torchrun's restart count: 0 on the first attempt, n after n restarts (--max-restarts).
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    # Collectives inside user code need real processes. In-process, the policy has one worker
    # that sees the whole batch: the same numbers as two data-parallel workers whose gradients
    # are all-reduced (equal shards, mean losses), which is what the test checks.
    policy_workers = 1 if args.mode == "inprocess" else 2
    initialize(
        args.mode,
        seed=args.seed,
        groups=[
            DeviceGroup("policy", policy_workers, "cpu"),
            DeviceGroup("sampler", 2, "cpu", max_restarts=1 if args.chaos else 0),
            DeviceGroup("processor", 2, "cpu"),
        ],
        notifier=args.notifier,
        name=f"rl-demo-{args.mode}",
    )
    table: list[dict] = []
    first_step = 0
    checkpoint = None
    if args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        checkpoint = os.path.join(args.checkpoint_dir, "policy.pt")
    sampler_dir = (
        tempfile.mkdtemp(prefix="rl-sampler-") if args.chaos and args.mode == "ray" else None
    )
    try:
        policy = Policy(2.0, args.ballast_mib, remote_group="policy")
        reference = Reference(args.ballast_mib, remote_group="policy")  # colocated
        sampler = Sampler(args.ballast_mib, sampler_dir, remote_group="sampler")
        processor = RewardProcessor(args.seed, remote_group="processor")
        if is_main_process():
            print(get_device_placement(), flush=True)
        if args.sync == "collective":
            # One group over the policy's and the sampler's workers (policy ranks first).
            collective_group(WEIGHTS, [policy, sampler])
        if checkpoint is not None and os.path.exists(checkpoint):
            # A restarted job (torchrun --max-restarts) goes on after the last step it saved.
            saved = torch.load(checkpoint, weights_only=False)
            policy.load_checkpoint(checkpoint)()
            table, first_step = saved["table"], saved["step"] + 1
            if is_main_process():
                print(f"attempt {attempt}: resuming after step {saved['step']}", flush=True)
        for step in range(first_step, args.steps):
            if args.chaos and args.mode == "local" and attempt == 0 and step == args.steps // 2:
                if os.environ.get("RANK") == "1":
                    print(f"step {step:2d}  chaos: process 1 exits", flush=True)
                    os._exit(3)  # torchrun stops process 0 and starts the job again
            started = time.perf_counter()
            if args.sync == "collective":
                # The source's call first (under torchrun and in-process the calls run one
                # after the other); on Ray both run at once and meet in the broadcast.
                sent = policy.send_weights()
                loaded = sampler.receive_weights()
                sent()
            else:
                loaded = sampler.load_weights(policy.get_weights())
            loaded()
            sync_s = time.perf_counter() - started
            if args.chaos and args.mode == "ray" and step == args.steps // 2:
                pid = kill_a_worker("sampler", 1)
                print(f"step {step:2d}  chaos: SIGKILLed sampler rank 1 (pid {pid})", flush=True)
            # Lazy results flow between groups; nothing waits until a value is needed.
            rollouts = sample(
                sampler,
                make_prompts(step, args.batch),
                step,
                retry=args.chaos and args.mode == "ray",
            )
            scored = processor.score(rollouts)
            rewards = np.array([r[3] for r in scored()], dtype=np.float32)
            batch = {
                "states": np.stack([r[1] for r in scored()]),
                "actions": np.array([r[2] for r in scored()]),
                "advantages": rewards - rewards.mean(),
            }
            ref_logp = reference.log_probs(batch)  # on the policy's processes, before its step
            loss = policy.train_step(batch)
            row = {
                "step": step,
                "loss": loss(),
                "ref_logp": ref_logp(),
                "reward": float(rewards.mean()),
                "sync_s": sync_s,
            }
            table.append(row)
            if checkpoint is not None:
                # Every process passes the same state (its own timings stay out of it).
                done = [{**r, "sync_s": None} for r in table]
                policy.save_checkpoint(checkpoint, {"step": step, "table": done})()
            if is_main_process():
                print(
                    f"step {step:2d}  loss {row['loss']:+.6f}  reward {row['reward']:.3f}  "
                    f"ref log-prob {row['ref_logp']:+.4f}  "
                    f"weight sync {1000 * sync_s:.1f} ms ({args.sync})",
                    flush=True,
                )
    finally:
        shutdown()
    if args.out and is_main_process():
        with open(args.out, "w") as f:
            json.dump({"mode": args.mode, "steps": table}, f, indent=1)
    return table


if __name__ == "__main__":
    main(sys.argv[1:])
