"""Stage 04 as it runs on a node: one engine per rank, each rank rolling out its share of a step's
groups, the row hand-off on a CPU group with its own timeout, the per-step memory hand-over between
engine and trainer. The torchrun runs use gloo on CPU. (The weight push into vLLM, one tensor
at a time: test_model's vLLM engine test.)"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import common as C

G = importlib.import_module("04_reterm_grpo")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return C.make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", arch="qwen3")


def _torchrun(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# ── the per-step order: roll out, sleep, train, wake, load, wake, roll out ────────────────


class RecordingEngine:
    def __init__(self, tok, calls: list):
        self.tokenizer, self.calls = tok, calls

    def sleep(self):
        self.calls.append("sleep")

    def wake_weights(self):
        self.calls.append("wake_weights")

    def update_weights(self, named_tensors):
        assert isinstance(named_tensors, types.GeneratorType)
        n = sum(1 for _ in named_tensors)
        self.calls.append(f"load:{n}")

    def wake_kv(self):
        self.calls.append("wake_kv")

    def close(self):
        self.calls.append("close")


@pytest.mark.slow
def test_each_step_sleeps_trains_wakes_loads_then_rolls_out(tiny, tmp_path, monkeypatch):
    tok, calls = C.load_tokenizer(tiny), []
    prompt = tok.encode("<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n")
    rows = []
    for a, adv in ((5, 1.0), (6, -1.0)):
        trace = C.TokenTrace()
        trace.add_context(prompt)
        trace.add_sampled([a], [-3.0], trained=True)
        rows.append(G.Row(trace, adv))
    def run_groups(plan, *a, **k):
        calls.append("rollout")
        return [], {"env_steps": 2}

    def train_on_batch(*a, **k):
        calls.append("train")
        return real_train(*a, **k)

    real_train = G.train_on_batch
    monkeypatch.setattr(G, "run_groups", run_groups)
    monkeypatch.setattr(G, "group_rows", lambda *a: rows)
    monkeypatch.setattr(G, "train_on_batch", train_on_batch)
    monkeypatch.setattr(G, "start_rollouts", lambda *a, **k: (G.FailurePool(0.1),
                                                              RecordingEngine(tok, calls)))
    G.main(["--model", str(tiny), "--out", str(tmp_path / "o"), "--tasks", str(ROOT / "tasks"),
            "--steps", "2", "--save-every", "0", "--fresh-frac", "1", "--lr", "1e-3"])
    n = len(C.load_model(tiny).state_dict())
    step = ["rollout", "sleep", "train", "wake_weights", f"load:{n}", "wake_kv"]
    assert calls == step + step + ["close"], calls
    row = C.read_jsonl(tmp_path / "o" / "metrics.jsonl")[0]
    assert {"mem_gb_rollout", "mem_gb_train", "mem_gb_push"} <= set(row) and row["mem_gb_train"] > 0


# ── the hand-off waits through a rollout longer than the training group's timeout ─────────

_SLOW_HANDOFF = """
import importlib, os, signal, sys, threading, time
sys.path.insert(0, {root!r})
import torch
import common as C
G = importlib.import_module("04_reterm_grpo")

def print(*args, flush=True):  # one write per line: both ranks print at once, into one pipe
    os.write(1, (" ".join(map(str, args)) + "\\n").encode())

rank, world, _ = C.init_distributed(timeout_s=3)  # the training group: 3 s
C.cpu_group(120)  # the hand-off group
cfg = C.parse_config(G.Config, ["--model", "m", "--out", "o", "--groups-per-step", "2", "--mode", "standard"])

def slow_share(plan, cfg, tasks, engine, rcfg):  # rank 1's rollout takes 6 s, twice the timeout
    if rank == 1:
        time.sleep(6)
    groups = [G.Group("fresh", p["key"], "fresh", [C.Episode(None, [], C.TokenTrace(), reward=r)
                                                   for r in (0.0, 1.0)], p["key"]) for p in plan]
    return groups, {{"env_steps": 2, "wall_s": 6.0 * rank, "engine_idle_frac": 0.0}}

G.run_groups = slow_share
t = time.monotonic()
plan = G.plan_groups(1, cfg, G.FailurePool(0.1), {{"a": 0, "b": 0}}) if rank == 0 else None
groups, stats = G.hand_off(plan, lambda share: G.run_groups(share, cfg, None, None, None), rank, world)
print("COLLECTED", rank, sorted(g.key for g in groups), stats["episodes_by_rank"], stats["env_steps"],
      round(time.monotonic() - t), flush=True)
try:  # the control: the same wait on the training group times out
    if rank == 1:
        time.sleep(6)
    torch.distributed.barrier()
    print("CONTROL", rank, "passed", flush=True)
except Exception as e:
    print("CONTROL", rank, "timed out", type(e).__name__, flush=True)

def stop(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, stop)  # as the stages' env_session does
t = time.monotonic()
try:  # a SIGTERM (torchrun passing on a Ctrl-C) ends the wait for a slow rank at once
    if rank == 0:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    else:
        time.sleep(6)
    C.all_gather_objects(rank)
except BaseException as e:
    print("STOPPED", rank, type(e).__name__, round(time.monotonic() - t), flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_a_rollout_longer_than_the_collective_timeout_still_hands_its_rows_over(tmp_path):
    """...and a signal still stops a rank that waits for a slower one (Ctrl-C cleanup)."""
    script = tmp_path / "handoff.py"
    script.write_text(_SLOW_HANDOFF.format(root=str(ROOT)))
    r = _torchrun([str(script)], timeout=300)
    out = [ln.split(maxsplit=2) for ln in r.stdout.splitlines() if ln.startswith(("COLLECTED", "CONTROL"))]
    got = {(k, rank): rest for k, rank, rest in out}
    assert {("COLLECTED", "0"), ("COLLECTED", "1")} <= set(got), r.stdout[-2000:] + r.stderr[-3000:]
    for rank in "01":  # both groups back on both ranks, one per rank, rank 0 waited ~6 s > 3 s
        assert got["COLLECTED", rank].startswith("['a', 'b'] [2, 2] 4"), got
    assert int(got["COLLECTED", "0"].split()[-1]) >= 5
    assert got["CONTROL", "0"].startswith("timed out"), got  # so 3 s really was the limit
    stopped = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("STOPPED 0")]
    assert stopped and stopped[0][2] == "KeyboardInterrupt" and int(stopped[0][3]) <= 3, r.stdout[-2000:]


# ── torchrun: 2 ranks, fork mode, resume, equal to one process ────────────────────────

COIN = "mkdir -p /logs/verifier; echo $((RANDOM % 2)) > /logs/verifier/reward.txt\n"


def _leftovers(task: str, out: Path) -> list[str]:
    import hashlib

    client = C.docker_client()
    pool_repo = "reterm-pool/" + hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:12]
    boxes = client.api.containers(all=True, filters={"label": f"reterm.task={task}"})
    tags = [t for im in client.images.list() for t in im.tags
            if t.startswith((f"reterm-snap/{task}:", pool_repo))]
    return [c["Id"][:12] for c in boxes] + tags


@pytest.mark.slow
@pytest.mark.usefixtures("docker_ready")
@pytest.mark.usefixtures("vllm_ready")
def test_torchrun_two_ranks_roll_out_their_share_resume_and_train_as_one_process(make_task, tiny, tmp_path):
    """Every step: both ranks ran episodes (episodes_by_rank) and trained rows of their own (one row
    per micro-batch, two minibatches: the token normaliser spans both ranks), and the losses and
    gradient norms equal a 1-process replay of the same rows (each step's rows are saved)."""
    name = "grpodist36"  # a verifier that mixes rewards inside a group (the tiny model never passes a task)
    task = C.load_task(make_task(name, test=COIN))
    out = tmp_path / "grpo"
    args = ["04_reterm_grpo.py", "--model", str(tiny), "--out", str(out), "--tasks", str(task.path.parent),
            "--fresh-frac", "0.5", "--groups-per-step", "2", "--group-size", "4", "--max-tokens", "16",
            "--max-turns", "2", "--max-context", "2048", "--engine", "vllm", "--dtype", "float32",
            "--lr", "1e-3", "--concurrency", "8", "--save-every", "1", "--save-rows",
            "--micro-tokens", "1", "--updates", "2"]  # a micro-batch per row: both ranks get rows
    try:
        r = _torchrun(args + ["--steps", "2", "--keep-pool"])  # the pool's images stay for the resume
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
        r = _torchrun(args + ["--steps", "3"])
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
        assert "resumed after step 2" in r.stdout + r.stderr
    finally:
        leaked = _leftovers(name, out)
        for ref in leaked:  # clean up before failing, so no other test sees them
            if ":" in ref:
                C.remove_image(ref)
            else:
                C.docker_client().api.remove_container(ref, force=True)
    assert not leaked, leaked
    rows = C.read_jsonl(out / "metrics.jsonl")
    assert [x["step"] for x in rows] == [1, 2, 3]
    assert all(len(x["episodes_by_rank"]) == 2 and min(x["episodes_by_rank"]) > 0 for x in rows), rows
    # no pool at first: step 1 starts fresh, its failures feed the pool, later steps fork from it
    assert [g["kind"] for g in rows[0]["group_rewards"]] == ["fresh", "fresh"] and rows[0]["added"] > 0
    assert all("fork" in [g["kind"] for g in x["group_rewards"]] for x in rows[1:]), rows
    # the 1-process replay: the same rows, the same optimizer, step by step
    cfg = C.parse_config(G.Config, args[1:])
    model, tok = C.load_model(tiny), C.load_tokenizer(tiny)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    trained = 0
    for x in rows:
        saved = torch.load(out / "rows" / f"step{x['step']}.pt", weights_only=False)
        if not saved:
            assert "loss" not in x
            continue
        stats = G.train_on_batch(model, opt, [G.Row(t, a) for t, a in saved], cfg, torch.device("cpu"),
                                 tok.pad_token_id, step=x["step"])
        assert len(saved) >= 4 and min(x["train_tokens_by_rank"]) > 0, x  # 2 rows per minibatch at least
        assert sum(x["train_tokens_by_rank"]) == x["train_tokens"] == stats["train_tokens"]
        assert stats["loss"] == pytest.approx(x["loss"], abs=1e-5), (x["step"], stats, x)
        assert stats["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-4, abs=1e-6)
        assert stats["nll"] == pytest.approx(x["nll"], abs=1e-5)  # the policy before this step's update
        # both ranks' engines sampled from the weights streamed out of the FSDP shards after the
        # previous step (with lr 1e-3, stale weights would show here)
        assert x["mismatch_kl"] < 1e-6 and abs(x["is_weight"] - 1) < 1e-4, x
        trained += 1
    assert trained, "every group of every step was uniform: nothing to compare"
    # final/ is the training run's own last state, exactly (the step-3 checkpoint), in the training dtype
    final = C.load_model(out / "final").state_dict()
    saved = C.load_model(tiny)
    assert C.load_checkpoint(out / "ckpt", saved, torch.optim.AdamW(saved.parameters()))["step"] == 3
    assert all(torch.equal(final[k], v) and v.dtype == torch.float32 for k, v in saved.state_dict().items())
    # ...and it is where the replay went. Not elementwise: float noise in a near-zero gradient
    # (another CPU, other kernels) flips that element's first Adam step (about ±lr), so the check is
    # on how far apart the runs are relative to how far training moved each tensor
    init = C.load_model(tiny).state_dict()
    for k, v in model.state_dict().items():
        moved, apart = (v - init[k]).norm().item(), (final[k] - v).norm().item()
        assert apart <= 0.02 * moved + 1e-6, (k, apart, moved, (final[k] - v).abs().max().item())


def test_a_checkpoint_before_the_first_update_leaves_that_update_unchanged(tmp_path):
    """A step whose groups are all uniform trains nothing, yet its checkpoint is saved; saving
    must not count as an Adam step (torch's get_state_dict makes the state with a zero-lr step),
    or the first real update differs from a run that never saved."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-2), torch.optim.AdamW(b.parameters(), lr=1e-2)
    C.save_checkpoint(tmp_path / "ckpt", b, ob, {"step": 0})
    for m, o in ((a, oa), (b, ob)):
        m(torch.ones(2, 4)).sum().backward()
        o.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
