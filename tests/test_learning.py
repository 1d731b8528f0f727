"""The micro task family (bench/microtasks.py) and a CI-sized learning check on it: after a short SFT,
forked recoveries give non-uniform reward groups, and one fork-GRPO step on them raises the
policy's log-probability of the successful recoveries relative to the failed ones."""

from __future__ import annotations

import dataclasses
import importlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

import batch_rollouts as R
import pytest
import torch

import common as C

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import microtasks  # noqa: E402

G = importlib.import_module("04_reterm_grpo")
EV = importlib.import_module("05_eval_tb2")


def test_generator_split_is_by_parameters_and_fixed(tmp_path):
    a = microtasks.generate(tmp_path / "a", n_train=36, n_heldout=12, seed=0)
    b = microtasks.generate(tmp_path / "b", n_train=48, n_heldout=16, seed=0)
    assert a["heldout"] and a["train"] and not set(a["heldout"]) & set(a["train"])
    # more tasks never move a task across the split (it depends on the parameters only)
    assert set(a["heldout"]) <= set(b["heldout"]) and set(a["train"]) <= set(b["train"])
    def pair(n: str) -> tuple:  # micro-<template>-<first argument>[-<mode>]-<dst>
        parts = n.split("-")
        return parts[2], parts[-1]

    held_pairs = {pair(n) for n in b["heldout"]}
    assert not held_pairs & {pair(n) for n in b["train"]}
    # a pool part takes its own pairs from the train side only: held-out stays exactly the same
    c = microtasks.generate(tmp_path / "c", n_train=48, n_heldout=16, seed=0, pool_frac=0.2)
    assert c["heldout"] == b["heldout"] and c["pool"] and not b["pool"]
    pool_pairs = {pair(n) for n in c["pool"]}
    assert not pool_pairs & held_pairs and not pool_pairs & {pair(n) for n in c["train"]}
    assert sorted(p.name for p in (tmp_path / "c/pool").iterdir()) == c["pool"]
    # a dev part (recipe choices) takes its own pairs from the train side too: held-out unchanged
    e = microtasks.generate(tmp_path / "e", n_train=48, n_heldout=16, seed=0, pool_frac=0.2, dev_frac=0.2,
                            n_dev=8)
    assert e["heldout"] == b["heldout"] and len(e["dev"]) == 8
    dev_pairs = {pair(n) for n in e["dev"]}
    assert not dev_pairs & held_pairs and not dev_pairs & {pair(n) for n in e["train"] + e["pool"]}
    assert microtasks.split_pairs(0, 0.25, 0.2) == microtasks.split_pairs(0, 0.25, 0.2, 0.0)
    # one environment for the whole family: one set of image layers
    assert len(microtasks.env_hash(tmp_path / "b").split(",")) == 1
    for name in b["train"][:5]:
        t = C.load_task(tmp_path / "b/train" / name)
        assert t.allow_internet is False and "# step:" in (t.solution_dir / "solve.sh").read_text()
    # the stale-file variant: a seeded share of every part, the same tasks and split, a second image
    d = microtasks.generate(tmp_path / "d", n_train=48, n_heldout=16, seed=0, pool_frac=0.2, stale_frac=0.5)
    assert {k: d[k] for k in ("train", "pool", "heldout")} == {k: c[k] for k in ("train", "pool", "heldout")}
    assert not b["stale"] and len(microtasks.env_hash(tmp_path / "d").split(",")) == 2
    for part in ("train", "pool", "heldout"):
        share = sum(n in d["stale"] for n in d[part]) / len(d[part])
        assert 0.2 < share < 0.8, (part, share)
        for name in d[part]:
            steps = (tmp_path / "d" / part / name / "solution/solve.sh").read_text().split("# step: ")[1:]
            assert steps[0].startswith(microtasks.STALE_STEP[0]) == (name in d["stale"])


@pytest.mark.slow
def test_oracle_passes_null_fails_and_side_effects_are_penalised(docker_ready, tmp_path):
    split = microtasks.generate(tmp_path / "mt", n_train=12, n_heldout=4, seed=0)
    tasks = tmp_path / "mt/train"
    assert EV.main(["--tasks", str(tasks), "--agent", "oracle", "--out", str(tmp_path / "o"),
                    "--concurrency", "4"])["pass_at_1"] == 1.0
    assert EV.main(["--tasks", str(tasks), "--agent", "null", "--out", str(tmp_path / "n"),
                    "--concurrency", "4"])["pass_at_1"] == 0.0
    task = C.load_task(tasks / split["train"][0])
    solve = (task.solution_dir / "solve.sh").read_text()
    with C.env_session():
        for extra in ("touch /tmp/stray", "echo x >> /app/data/red.txt", "touch /app/out/other.txt",
                      "chmod 600 /app/data/blue.txt", "mkdir /app/tmp"):
            with C.start_env(task) as env:  # the right outcome plus one stray change: reward 0
                assert env.bash(solve + "\n" + extra).exit_code == 0
                assert env.verify().reward == 0.0, extra
        with C.start_env(task) as env:
            env.bash(solve)
            assert env.verify().reward == 1.0


@pytest.mark.slow
def test_stale_file_fails_the_plain_procedure_observably_and_the_repair_passes(docker_ready, tmp_path):
    """A stale-file task: the steps of the plain task run cleanly and fail the tests, listing the output
    folder shows why, and removing the file passes in the same container (the repair a recovery must
    find)."""
    name = microtasks.write_task(tmp_path / "t", "copy", "green", "elk", "644", stale=True)
    task = C.load_task(tmp_path / "t" / name)
    plain = "mkdir -p /app/out && cp /app/data/green.txt /app/out/elk.txt"
    with C.env_session(), C.start_env(task) as env:
        assert env.bash(plain).exit_code == 0
        assert env.verify().reward == 0.0
        assert "report.old" in env.bash("ls -la /app/out").output
        assert env.bash(microtasks.STALE_STEP[1]).exit_code == 0
        assert env.verify().reward == 1.0


@pytest.mark.slow
def test_varied_causes_hold_their_names_out_and_each_is_observable_and_repairable(docker_ready, tmp_path):
    """--stale-vary: the planted entry's kind and name vary by task; dev and held-out tasks carry
    names no train or pool task has; each solution removes its own entry first. In a container, for
    each kind: the plain procedure fails the tests, what the policy sees names the entry, and the
    solution's removal step repairs it."""
    split = microtasks.generate(tmp_path / "v", n_train=120, n_heldout=40, seed=0, pool_frac=0.2,
                                stale_frac=0.6, dev_frac=0.2, n_dev=30, stale_vary=True)
    causes = split["causes"]
    assert set(causes) == set(split["stale"])
    names = {part: {Path(causes[t]["path"]).name for t in split[part] if t in causes
                    and causes[t]["kind"] != "clash"} for part in ("train", "pool", "dev", "heldout")}
    assert names["heldout"] and names["dev"] and names["train"]
    assert not (names["heldout"] | names["dev"]) & (names["train"] | names["pool"]), names
    assert {c["kind"] for c in causes.values()} == set(microtasks.STALE_KINDS)
    assert len(microtasks.env_hash(tmp_path / "v").split(",")) > 4  # one image per distinct entry
    for part in ("train", "heldout"):
        for name in (n for n in split[part] if n in causes):
            first = (tmp_path / "v" / part / name / "solution/solve.sh").read_text().split("# step: ")[1]
            assert microtasks.is_stale_step(first.splitlines()[0]) and causes[name]["path"] in first
    for kind in microtasks.STALE_KINDS:
        cause = microtasks.stale_cause(kind, "junk.txt", "elk")
        name = microtasks.write_task(tmp_path / kind, "write", "apple", "elk", "", stale=cause)
        task = C.load_task(tmp_path / kind / name)
        with C.env_session(), C.start_env(task, internet=False) as env:
            plain = env.bash("mkdir -p /app/out && echo apple > /app/out/elk.txt")
            assert env.verify().reward == 0.0, kind
            seen = plain.output + env.bash("ls -la /app/out").output
            assert Path(cause["path"]).name in seen
            assert ("Is a directory" in plain.output) == (kind == "clash"), plain.output
            assert env.bash(cause["step"][1] + " && echo apple > /app/out/elk.txt").exit_code == 0
            assert env.verify().reward == 1.0, kind


def test_entry_split_twins_train_tasks_with_unseen_entries_and_keeps_them_out_of_training(tmp_path):
    """--entry-split: every dev and held-out task is a train task's twin (same instruction and solution
    steps after the removal) whose planted entry is the only difference; their names, and the unseen
    kind, occur in no train or pool task; dev and held-out twin distinct train tasks; fixed by the seed."""
    kw = dict(n_train=200, n_heldout=40, n_dev=20, seed=3, pool_frac=0.2, stale_frac=0.5, stale_vary=True,
              stale_compose=True, entry_split=True)
    split = microtasks.generate(tmp_path / "a", **kw)
    assert split == microtasks.generate(tmp_path / "b", **kw)
    assert len(split["heldout"]) == 40 and len(split["dev"]) == 20
    causes = split["causes"]
    twins = split["heldout"] + split["dev"]
    assert set(twins) <= set(causes)  # every twin has its entry
    trained = {"train": split["train"], "pool": split["pool"]}
    seen_kinds = {causes[t]["kind"] for part in trained.values() for t in part if t in causes}
    assert seen_kinds and not seen_kinds & set(microtasks.UNSEEN_KINDS)
    assert {causes[t]["kind"] for t in split["heldout"]} == set(microtasks.STALE_KINDS)
    names = {part: {Path(causes[t]["path"]).name for t in split[part] if t in causes and
                    causes[t]["kind"] != "clash"} for part in ("train", "pool", "dev", "heldout")}
    assert names["heldout"] and names["dev"] and not names["heldout"] & names["dev"]
    assert not (names["heldout"] | names["dev"]) & (names["train"] | names["pool"])
    bases = {}
    for part in ("heldout", "dev"):
        for t in split[part]:
            assert t.endswith(f"-{part}")
            base = t.removesuffix(f"-{part}")
            assert base in split["train"]  # a twin of a train task: its arguments were trained
            bases[t] = base
            twin, orig = (C.load_task(tmp_path / "a" / p / n) for p, n in ((part, t), ("train", base)))
            assert twin.instruction == orig.instruction
            steps = (twin.solution_dir / "solve.sh").read_text().split("# step: ")
            assert microtasks.is_stale_step(steps[1].splitlines()[0]) and causes[t]["path"] in steps[1]
            assert steps[2:] == [x for x in (orig.solution_dir / "solve.sh").read_text().split("# step: ")[1:]
                                 if not microtasks.is_stale_step(x.splitlines()[0])]
    assert len(set(bases.values())) == len(twins)  # dev and held-out twin distinct train tasks
    with pytest.raises(ValueError, match="stale_vary"):
        microtasks.generate(tmp_path / "c", n_train=20, entry_split=True)


def test_composed_stale_names_split_by_piece_pair_and_each_piece_is_one_token(tmp_path):
    """--stale-compose: every stem and extension occurs in train names, no dev or held-out name
    does; the split follows the task seed; generate plants them; make_model keeps each piece one token."""
    for seed in (0, 20261203):
        names = microtasks.composed_stale_names(seed)
        train = set(names["train"])
        assert not (set(names["dev"]) | set(names["heldout"])) & train
        assert not set(names["dev"]) & set(names["heldout"])
        assert {n.split(".")[0] for n in train} == set(microtasks.STALE_STEMS)
        assert {n.split(".")[1] for n in train} == set(microtasks.STALE_EXTS)
    assert microtasks.composed_stale_names(0) != microtasks.composed_stale_names(1)
    split = microtasks.generate(tmp_path / "c", n_train=80, n_heldout=30, seed=0, stale_frac=0.8,
                                dev_frac=0.2, n_dev=30, stale_vary=True, stale_compose=True)
    names = microtasks.composed_stale_names(0)
    for part in ("train", "dev", "heldout"):
        planted = {Path(c["path"]).name for t, c in split["causes"].items() if t in split[part]
                   and c["kind"] != "clash"}
        assert planted and planted <= set(names[part]), (part, planted)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(microtasks.make_model(tmp_path / "m", 64, 1, heads=2,
                                                              words=microtasks.STALE_PIECES))
    pieces = [tok.decode([i]) for i in tok("rm -rf /app/out/cache.part")["input_ids"]]
    assert pieces[-3:] == ["cache", ".", "part"], pieces


def test_cause_stats_counts_recoveries_by_cause_own_removals_and_blind_ones():
    import experiment_learning as E

    rm = lambda *paths: [{"command": f"rm -rf {p}"} for p in paths]  # noqa: E731
    causes = {"a": {"kind": "file", "path": "/app/out/junk.txt"},
              "b": {"kind": "clash", "path": "/app/out/elk.txt"}}
    rec = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    cmds = [rm("/app/out/junk.txt"), rm("/app/out/report.old"), rm("/app/out/elk.txt"), [],
            rm("/app/out/report.old"), rm("/app/out/fox.txt")]
    tasks = ["a", "a", "b", "b", "c", "c"]
    st = E.cause_stats(rec, cmds, tasks, causes)
    assert st["stale"] == 0.5 and st["other"] == 0.5 and st["file"] == 0.5 and st["clash"] == 0.5
    assert st["folder"] is None
    # a: one of two removed its own junk.txt; b: one of two removed the folder at elk.txt
    assert st["stale_removed"] == 0.5 and st["stale_removed_recovered"] == 1.0
    # c has nothing planted: removing report.old there is blind; removing its own wrong output is not
    assert st["blind_removal"] == 0.5
    # a's second fork removed report.old, a planted name not its own (recalled, not read); clash
    # states (b) have no planted name of their own and are not counted
    assert st["other_name_removal"] == 0.5
    assert set(st) == set(E.CAUSES)
    composed = E.cause_stats([0.0], [rm("/app/out/cache.tmp")], ["c"], causes)
    assert composed["blind_removal"] == 1.0  # a composed STEM.EXT name counts as planted too


@pytest.mark.slow
def test_repair_rows_remove_the_policys_stray_output_and_verify(docker_ready, tmp_path):
    """experiment_learning.repair_rows on a failure state made by hand: the output was written under
    the wrong name. The repair removes that file (and nothing the solution names), replays the
    solution, and the row is kept because the tests pass in the fork."""
    import experiment_learning as E

    name = microtasks.write_task(tmp_path / "t", "copy", "green", "elk", "644")
    task = C.load_task(tmp_path / "t" / name)
    call = {"type": "function", "function": {"name": "bash", "arguments": {
        "command": "mkdir -p /app/out && cp /app/data/green.txt /app/out/owl.txt"}}}
    failed = C.initial_messages(task.instruction) + [
        {"role": "assistant", "content": "Next: copy green to owl.", "tool_calls": [call]},
        {"role": "tool", "content": "[exit code: 0]"},
        {"role": "assistant", "content": "The task is complete."}]
    with C.env_session():
        with C.start_env(task) as env:
            env.bash(call["function"]["arguments"]["command"])
            snap = env.snapshot()
            assert env.verify().reward == 0.0
        # token ids: only a rollout's context needs them, the repair reads the messages
        state = C.FailureState("s0", name, snap, failed, [], "faulty_implementation")
        failures = tmp_path / "failures.jsonl"
        C.append_jsonl(failures, dataclasses.asdict(state))
        try:
            assert E.repair_rows(failures, tmp_path / "t", tmp_path / "rows.jsonl", 2) == 1
        finally:
            C.remove_image(snap)
    row = C.read_jsonl(tmp_path / "rows.jsonl")[0]
    tfi = row["train_from_message_index"]
    assert row["messages"][:tfi - 1] == failed and row["messages"][tfi - 1]["role"] == "user"
    cmds = [c["function"]["arguments"]["command"]
            for m in row["messages"][tfi:] for c in m.get("tool_calls") or []]
    assert cmds[1:] == ["rm -rf -- /app/out/owl.txt", "mkdir -p /app/out",
                        "cp /app/data/green.txt /app/out/elk.txt"], cmds


def _run(args: list, log: Path) -> None:
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, stdout=f,
                            stderr=subprocess.STDOUT).returncode
    assert rc == 0, log.read_text()[-3000:]


def _mean_logp(model, rows: list, pad_id: int) -> list[float]:
    """Per row: the mean log-probability of its trained (sampled recovery) tokens."""
    with torch.no_grad():
        out = []
        for r in rows:
            b = C.collate([r.trace], pad_id)
            lp = C.token_logprobs(model, b)[0]
            m = b["loss_mask"][0].bool()
            out.append(lp[m].mean().item())
    return out


def check_engine_serves_the_trained_weights(engine, final: Path, start: Path, instruction: str) -> None:
    """vLLM's log-probs of what it samples equal transformers' forward on `final` (02's output), and
    not the start model's."""
    prompt = C.render_ids(engine.tokenizer, C.initial_messages(instruction), add_generation_prompt=True)
    (gen,) = engine.generate([prompt], C.SamplingConfig(temperature=1.0, max_tokens=8, seed=3))
    assert 1 <= len(gen.ids) <= 8 and len(gen.logprobs) == len(gen.ids)

    def logprobs(model_dir: Path) -> torch.Tensor:
        with torch.no_grad():
            logits = C.load_model(model_dir)(torch.tensor([prompt + gen.ids])).logits[0, len(prompt) - 1: -1]
        return logits.float().log_softmax(-1).gather(-1, torch.tensor(gen.ids)[:, None])[:, 0]

    vllm_lp = torch.tensor(gen.logprobs)
    assert (vllm_lp - logprobs(final)).abs().max() <= 1e-4
    assert (vllm_lp - logprobs(start)).abs().max() > 1e-2  # SFT moved them


@pytest.mark.slow
def test_sft_then_one_fork_grpo_step_prefers_successful_recoveries(docker_ready, tmp_path):
    split = microtasks.generate(tmp_path / "mt", n_train=12, n_heldout=4, seed=0)
    name = next(n for n in split["train"] if n.startswith("micro-copy"))
    tasks_dir = tmp_path / "mt/train"
    task = C.load_task(tasks_dir / name)
    data = tmp_path / "data.jsonl"
    _run(["01_build_data.py", "--tasks", tasks_dir, "--task-filter", f"^{name}$", "--teacher", "oracle",
          "--out", data, "--faults-per-task", 3, "--concurrency", 1], tmp_path / "01.log")
    rows = C.read_jsonl(data)
    assert len(rows) >= 2
    base = microtasks.make_model(tmp_path / "base", hidden=64, layers=2, heads=2)
    _run(["02_sft.py", "--data", data, "--model", base, "--out", tmp_path / "sft", "--max-steps", 120,
          "--lr", 1e-2, "--warmup-steps", 4, "--max-len", 4096, "--micro-batch-tokens", 8192,
          "--grad-accum", 1, "--save-every", 0, "--all-assistant", "--no-activation-checkpointing"],
         tmp_path / "02.log")
    sft = tmp_path / "sft/final"
    tok = C.load_tokenizer(sft)
    engine_kind = "vllm" if importlib.util.find_spec("vllm") else "hf"
    kw = {"max_model_len": 4096, "seed": 0} if engine_kind == "vllm" else {}
    engine = C.make_engine(engine_kind, sft, dtype="float32", **kw)
    rcfg = C.RolloutConfig(max_turns=6, max_context=4096, command_timeout=30.0, concurrency=8,
                           sampling=C.SamplingConfig(max_tokens=160))
    states = []
    with C.env_session():
        try:
            for row in rows:  # the oracle's faulty first attempts, replayed and frozen as failure states
                failed = row["messages"][: row["train_from_message_index"] - 1]
                with C.start_env(task) as env:
                    for m in failed:
                        for call in m.get("tool_calls") or []:
                            env.bash(call["function"]["arguments"]["command"])
                    snap = env.snapshot()
                ids = C.render_ids(tok, failed, add_generation_prompt=False)
                ids = ids[: len(ids) - ids[::-1].index(tok.eos_token_id)]  # as sampled: ends at EOS
                states.append(C.FailureState(f"s{len(states)}", name, snap, failed, ids,
                                             "faulty_implementation"))
            groups, _ = R.run_recoveries(states, {name: task}, 12, engine, rcfg)  # 12: rarely all-success
        finally:
            for s in states:
                C.remove_image(s.snapshot)
    if engine_kind == "vllm":  # 02's final/ in vLLM samples with the trained weights, not the start's
        check_engine_serves_the_trained_weights(engine, sft, base, task.instruction)
    rewards = [[ep.reward for ep in g] for g in groups]
    kept, _ = G.drop_uniform_groups([G.Group("fork", s.id, s.category, g) for s, g in zip(states, groups,
                                                                                         strict=True)])
    assert kept, f"every recovery group is uniform after SFT: {rewards}"
    batch = G.group_rows(kept, use_std=True)
    model = C.load_model(sft)
    before = _mean_logp(model, batch, tok.pad_token_id)
    cfg = G.Config(model=str(sft), out=str(tmp_path / "grpo"), lr=1e-3, micro_tokens=16384)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    G.train_on_batch(model.train(), opt, batch, cfg, torch.device("cpu"), tok.pad_token_id, step=1)
    after = _mean_logp(model.eval(), batch, tok.pad_token_id)
    delta = [a - b for a, b in zip(after, before, strict=True)]
    good = [d for d, r in zip(delta, batch, strict=True) if r.adv > 0]
    bad = [d for d, r in zip(delta, batch, strict=True) if r.adv < 0]
    gain = sum(good) / len(good) - sum(bad) / len(bad)
    print(json.dumps({"rewards": rewards, "gain": gain}))
    assert gain > 0, (rewards, good, bad)
    # the failed recoveries became less likely (successful ones are near-certain already after SFT:
    # their log-probability may move either way by a little, the gap is what the update controls)
    assert sum(bad) / len(bad) < 0, bad


def test_plain_frac_picks_a_seeded_share_of_the_stale_train_tasks(tmp_path):
    import experiment_learning as E

    split = microtasks.generate(tmp_path / "t", n_train=48, n_heldout=16, seed=0, stale_frac=0.5)
    stale_train = set(split["stale"]) & set(split["train"])
    assert len(stale_train) >= 8
    half = E.demo_tasks(split, 0.5, 0)
    assert half < stale_train and len(half) == round(len(stale_train) / 2)
    assert E.demo_tasks(split, 0.5, 0) == half and E.demo_tasks(split, 0.5, 1) != half
    assert E.demo_tasks(split, 1.0, 0) == stale_train and not E.demo_tasks(split, 0.0, 0)
    for bad, what in ((["--plain-frac", "1.5"], "plain-frac"), (["--fresh-out"], "no-plain-demos")):
        with pytest.raises(SystemExit, match=what):
            E.main(["--out", str(tmp_path / "exp"), *bad])
    # plain_frac means nothing without plain rows: a resumed run of an older default matches
    off, on = {"plain_demos": False, "plain_frac": 1.0}, {"plain_demos": True, "plain_frac": 1.0}
    assert E.split_fields(off) == E.split_fields(off | {"plain_frac": 0.5}) == E.split_fields({})
    assert E.split_fields(on) != E.split_fields(on | {"plain_frac": 0.5})


@pytest.mark.slow
def test_experiment_command_runs_every_stage_to_the_sft_policy_and_writes_its_results(learning_run):
    """bench/experiment_learning.py end to end at a toy size up to the SFT policy's figures (learning_run:
    --sft-only, a 64x2 model, a few steps, a GRPO pool kept out of SFT, stale-file tasks, dev twins):
    the results.json contract, no split leaking into another, no snapshot left behind, and a second
    invocation reuses the finished seed instead of running it again. The chunks after SFT:
    test_a_seeds_grpo_chunks_... here, and test_paired's end-to-end replicate."""
    import docker
    import experiment_learning as E

    out, argv, res = learning_run
    assert res == json.loads((out / "results.json").read_text())
    for key in ("seeds", "heldout_tasks", "train_tasks", "sft_pass_at_1", "base_pass_at_1",
                "heldout_recovery_before", "sft_success_with_retry", "per_seed", "recovery_by_cause"):
        assert key in res, key
    s0 = res["per_seed"][0]
    assert res["sft_only"] and len(s0["recovery_sample_tasks"]) == len(s0["recovery_before"]) > 0
    assert res["evaluated_on"] == "dev" and set(s0["recovery_sample_tasks"]) <= set(res["dev_tasks"])
    assert res["seeds"] == [0] and len(res["heldout_tasks"]) == 3 and len(res["train_tasks"]) == 8
    # the commit the seed ran at (a tracked file edited while this test runs may add "+dirty" since)
    assert res["code"] == [str(s0["code"])] and s0["code"].split("+")[0] == E.code_version().split("+")[0]
    parts = [set(res[f"{k}_tasks"]) for k in ("train", "pool", "heldout", "dev")]
    assert all(parts) and all(not (a & b) for i, a in enumerate(parts) for b in parts[i + 1:])
    # success within one attempt + one recovery, never below Pass@1
    assert 0 <= s0["sft_pass_at_1"] <= res["sft_success_with_retry"] <= 1
    assert 0 < s0["env_steps_pool"]  # stage 03's pool collection, which fork's budget counts
    seed = out / "seed0"
    assert {r["task"] for r in C.read_jsonl(seed / "failures_train/attempts.jsonl")} <= parts[1]
    # --eval-on dev: every evaluation ran on dev tasks, and no held-out task was run at all
    assert {r["task"] for r in C.read_jsonl(seed / "failures_heldout/attempts.jsonl")} <= parts[3]
    assert {r["task"] for r in C.read_jsonl(seed / "eval_base/trials.jsonl")} == parts[3]
    # no row of any SFT phase (the warm-up's solutions, recovery and plain rows) is on another part's task
    rows = [r for f in ("sft.jsonl", "solutions.jsonl", "reterm.jsonl", "plain.jsonl")
            for r in C.read_jsonl(out / "data" / f)]
    assert rows and {r["task_id"] for r in rows} <= parts[0]
    assert not [p for p in seed.iterdir() if p.name in ("fork", "standard", "standard_retry")]  # no GRPO
    # stale-file tasks have recovery rows but no first-attempt (solution) row: nothing tells a first
    # attempt that the file is there
    split = json.loads((out / "tasks/split.json").read_text())
    stale = set(split["stale"])
    assert stale & parts[0] and not stale & {r["task_id"] for r in C.read_jsonl(out / "data/solutions.jsonl")}
    assert stale & parts[0] <= {r["task_id"] for r in C.read_jsonl(out / "data/reterm.jsonl")}
    # and (--plain-demos) each has the recovery from the plain procedure, the policy's first attempt there
    plain = [r for f in ("reterm.jsonl", "plain.jsonl") for r in C.read_jsonl(out / "data" / f)
             if r["meta"]["fault"] == "drop@0" and r["task_id"] in stale]
    assert sorted(r["task_id"] for r in plain) == sorted(stale & parts[0])
    for r in plain:
        tfi = r["train_from_message_index"]
        cmds = [[c["function"]["arguments"]["command"] for m in ms for c in m.get("tool_calls") or []]
                for ms in (r["messages"][:tfi], r["messages"][tfi:])]
        removal = f"rm -rf {split['causes'][r['task_id']]['path']}"  # --stale-vary: each its own entry
        assert removal not in cmds[0] and removal in cmds[1], cmds
    assert 0 <= res["heldout_failures_stale_frac"] <= 1
    assert set(res["recovery_by_cause"]) == {"before"}
    assert set(res["recovery_by_cause"]["before"]) == set(E.CAUSES)
    snaps = [r["snapshot"] for f in ("failures_train", "failures_heldout")
             for r in C.read_jsonl(seed / f / "failures.jsonl")]
    assert snaps  # the random-init policy fails, so there were states to snapshot
    for snap in snaps:
        with pytest.raises(docker.errors.ImageNotFound):
            C.docker_client().images.get(snap)
    # the SFT policy's figures as the seed wrote them, read back by a second invocation, not run again
    assert json.loads((seed / "sft_result.json").read_text()) == s0
    done = (seed / "sft_result.json").stat().st_mtime_ns
    assert json.loads(json.dumps(E.main(argv)["per_seed"])) == res["per_seed"]
    assert (seed / "sft_result.json").stat().st_mtime_ns == done
    # another split would reuse this split's task folders and 01 rows
    with pytest.raises(SystemExit, match="pool_frac"):
        E.main([*argv, "--pool-frac", "0.1"])


def test_a_seeds_grpo_chunks_share_the_fork_budget_and_its_results_pool_under_combine(
        tmp_path, monkeypatch, capsys):
    """run_seed after SFT and the report, the stage scripts stubbed by files they would write: 2 GRPO
    steps at --eval-every 1 are two chunks; after each fork chunk, standard and standard_retry run 04
    to the fork arm's environment steps, stage 03's pool included, all on the pool's tasks and fork
    from 03's train states; every point is evaluated and recorded; results.json, the plot and
    --combine pool the seeds. (learning_run stops at --sft-only; the real 04 and forks after SFT run
    in test_paired's end-to-end replicate.)"""
    import experiment_learning as E

    cost = {"fork": 10, "standard": 6, "standard_retry": 8}  # environment steps per 04 step
    runs: list[tuple] = []

    def stage(args: list, log: Path) -> None:
        script, a = args[0], {str(k): v for k, v in zip(args, [*args[1:], None], strict=True)}
        out = Path(a["--out"])
        if script == "01_build_data.py":
            out.parent.mkdir(parents=True, exist_ok=True)
            out.touch()
        elif script == "02_sft.py":  # a loss that shows copying at once: no extra warm-up run
            (out / "final").mkdir(parents=True)
            (out / "final/config.json").write_text("{}")
            C.append_jsonl(out / "metrics.jsonl", {"loss": 0.01})
        elif script == "03_collect_failures.py":  # held-out side: one pass and one failure; pool: 3 + 4 turns
            names = sorted(p.name for p in Path(a["--tasks"]).iterdir())
            tries = [(names[0], 2, 1.0), (names[1], 3, 0.0)] if a["--tasks"].name == "dev" else \
                [(names[0], 3, 0.0), (names[1], 4, 0.0)]
            for task, turns, reward in tries:
                C.append_jsonl(out / "attempts.jsonl", {"task": task, "turns": turns, "reward": reward})
                if reward < 1:
                    C.append_jsonl(out / "failures.jsonl", {"task": task, "snapshot": f"gone/{task}:0"})
            (out / "summary.json").write_text(json.dumps({"pass_rate": sum(r for *_, r in tries) / 2}))
        elif script == "05_eval_tb2.py":  # Pass@1 and success within one attempt + one recovery
            policy = Path(a["--model"]).parent.name  # base's is the seed folder
            p, swr = {"fork": (0.5, 0.75), "standard": (0.25, 0.25), "standard_retry": (0.5, 0.5)}.get(
                policy, (0.0, 0.0))
            out.mkdir(parents=True)
            (out / "summary.json").write_text(json.dumps({"pass_at_1": p, "success_with_retry": swr}))
        elif script == "04_reterm_grpo.py":  # resumes; steps on until --steps, or the budget is reached
            mode, steps, budget = a["--mode"], a["--steps"], a["--env-step-budget"]
            runs.append((mode, steps, budget, a["--tasks"].name, a.get("--failures"), "--keep-pool" in args))
            rows = C.read_jsonl(out / "metrics.jsonl")
            env = rows[-1]["env_steps_total"] if rows else 0
            for step in range(len(rows) + 1, steps + 1):
                if budget and env >= budget:
                    break
                env += cost[mode]
                C.append_jsonl(out / "metrics.jsonl", {"step": step, "env_steps_total": env, "reward": 0.5,
                                                       "groups": 2, "groups_dropped": cost[mode] // 4 - 1})
            (out / "final").mkdir(exist_ok=True)

    def recovery(cfg, model: Path, failures: Path, tasks: Path, seed: int):  # 2 forks of the one state
        rec = {"sft": [1.0, 0.0], "fork": [1.0, 1.0], "standard": [0.0, 0.0], "standard_retry": [0.0, 1.0]}
        return rec[model.parent.name], [[], []]

    removed = []
    monkeypatch.setattr(E, "sh", stage)
    monkeypatch.setattr(E, "solution_rows", lambda tasks, path, *a, **k: path.touch())
    monkeypatch.setattr(E, "plain_rows", lambda *a, **k: None)
    monkeypatch.setattr(E.microtasks, "make_model", lambda out, *a, **k: out.mkdir(parents=True))
    monkeypatch.setattr(E, "recovery_at_1", recovery)
    monkeypatch.setattr(C, "remove_snapshots", lambda *files: removed.append(files))
    argv = ["--out", str(tmp_path / "exp"), "--n-train", "6", "--n-heldout", "2", "--n-dev", "2",
            "--dev-frac", "0.2", "--eval-on", "dev", "--pool-frac", "0.3", "--seeds", "1",
            "--warmup-extra", "0", "--grpo-steps", "2", "--eval-every", "1", "--recovery-samples", "2",
            "--bootstrap", "50"]
    res = E.main(argv)
    seed = tmp_path / "exp/seed0"
    fail, big = seed / "failures_train/failures.jsonl", 10**6  # standard modes: no step limit, the budget
    assert runs == [("fork", 1, 0, "pool", fail, True), ("standard", big, 17, "pool", None, True),
                    ("standard_retry", big, 17, "pool", None, True), ("fork", 2, 0, "pool", fail, False),
                    ("standard", big, 27, "pool", None, False),
                    ("standard_retry", big, 27, "pool", None, False)]
    s0 = res["per_seed"][0]
    assert s0["env_steps_pool"] == 7 and s0["env_steps"] == {"fork": 27, "standard": 30, "standard_retry": 32}
    curve = {m: [(p["env_steps"], p["recovery"], p["pass_at_1"]) for p in c] for m, c in s0["curve"].items()}
    assert curve == {"fork": [(0, 0.5, 0.5), (17, 1.0, 0.5), (27, 1.0, 0.5)],
                     "standard": [(0, 0.5, 0.5), (18, 0.0, 0.25), (30, 0.0, 0.25)],
                     "standard_retry": [(0, 0.5, 0.5), (24, 0.5, 0.5), (32, 0.5, 0.5)]}
    # SFT: 1 of 2 attempts passed, and half the failed one's forks recovered
    assert s0["heldout_success_with_retry"] == {"base": 0.0, "sft": 0.75, "fork": 0.75, "standard": 0.25,
                                                "standard_retry": 0.5}
    assert s0["nonuniform_group_frac"] == {"fork": 0.5, "standard": 1.0, "standard_retry": 0.5}
    prog = C.read_jsonl(seed / "progress.jsonl")
    assert [(r["policy"], r.get("chunk")) for r in prog] == [("sft", None)] + [
        (m, c) for c in (1, 2) for m in ("fork", "standard", "standard_retry")]
    assert removed == [(seed / "failures_heldout/failures.jsonl", seed / "failures_train/failures.jsonl")]
    # the pooled figures, the plot and the printed tables
    assert res["heldout_recovery_after"] == {"fork": 1.0, "standard": 0.0, "standard_retry": 0.5}
    assert res["ci95_seeds"]["recovery_fork_minus_standard_retry"] is None  # one seed: no t-interval
    assert res["ci95_tasks"]["recovery_fork_minus_standard_retry"] == [0.5, 0.5]  # one state: no spread
    assert (tmp_path / "exp/learning.png").stat().st_size > 0
    assert "| fork minus standard_retry | | | +0.500 |" in capsys.readouterr().out
    done = (seed / "result.json").stat().st_mtime_ns  # a second invocation reads the finished seed back
    assert json.loads(json.dumps(E.main(argv)["per_seed"])) == json.loads(json.dumps(res["per_seed"]))
    assert (seed / "result.json").stat().st_mtime_ns == done and len(runs) == 6
    # --combine pools finished runs of one split (here the run and a copy of it) without running anything
    out, other = tmp_path / "exp", tmp_path / "copy"
    res = json.loads((out / "results.json").read_text())
    other.mkdir()
    (other / "results.json").write_text((out / "results.json").read_text())
    both = E.main(["--combine", str(out), str(other), "--out", str(tmp_path / "both"), "--bootstrap", "50"])
    assert both["runs"] == ["exp seed 0", "copy seed 0"] and both["per_seed"] == 2 * res["per_seed"]
    assert both["heldout_recovery_before"] == 0.5 and both["ci95_seeds"]["recovery_gain_fork"] == [0.5, 0.5]
    assert (tmp_path / "both" / "learning.png").stat().st_size > 0
    # its config is the runs' recipe (theirs, not --combine's defaults), and each run's config is kept
    assert both["config"]["n_train"] == 6 and both["config"]["grpo_steps"] == 2
    assert list(both["run_configs"]) == [str(out), str(other)]
    (other / "results.json").write_text(json.dumps(res | {"config": res["config"] | {"grpo_lr": 1.0}}))
    with pytest.raises(SystemExit, match="another recipe.*grpo_lr"):
        E.main(["--combine", str(out), str(other), "--out", str(tmp_path / "lr")])
    (other / "results.json").write_text(json.dumps(res | {"config": res["config"] | {"concurrency": 1}}))
    assert E.main(["--combine", str(out), str(other), "--out", str(tmp_path / "conc"), "--bootstrap", "50"])
    with pytest.raises(SystemExit, match="holds a run"):
        E.main(["--combine", str(other), "--out", str(out)])
    (other / "results.json").write_text(json.dumps(res | {"heldout_tasks": res["heldout_tasks"][:1]}))
    with pytest.raises(SystemExit, match="other tasks"):
        E.main(["--combine", str(out), str(other), "--out", str(tmp_path / "mixed")])


if __name__ == "__main__":
    pytest.main([__file__, "-q", "-s"])


def test_require_commit_refuses_another_checkout_before_it_writes_anything(tmp_path):
    """--require-commit: a protocol's seeds run the code its recipe was frozen at, or not at all."""
    import experiment_learning as E

    with pytest.raises(SystemExit, match="--require-commit 0000000: this checkout is at"):
        E.main(["--out", str(tmp_path / "run"), "--require-commit", "0000000"])
    assert not (tmp_path / "run").exists()


def test_first_seed_runs_only_the_seeds_asked_for(tmp_path, monkeypatch):
    """--first-seed S --seeds K runs seeds S..S+K-1 and no other (a protocol's seeds, one run each,
    pooled by --combine); a finished seed of the folder is read back, not run again."""
    import experiment_learning as E

    def fake_sh(args: list, log: Path) -> None:  # 01 writes its rows file; nothing else is run here
        rows = Path(args[args.index("--out") + 1])
        rows.parent.mkdir(parents=True, exist_ok=True)
        rows.touch()

    ran = []

    def fake_seed(cfg, seed: int, tasks: Path, data: Path, code: str | None) -> dict:
        ran.append(seed)
        res = {"seed": seed, "code": code, "base_pass_at_1": 0.0, "sft_pass_at_1": 0.1,
               "sft_train_pass_at_1": 0.5, "heldout_recovery_before": 0.2, "sft_success_with_retry": 0.2,
               "n_heldout_failures": 1, "heldout_failures_stale_frac": 0.0,
               "recovery_by_cause": {"before": {}}}
        (Path(cfg.out) / f"seed{seed}").mkdir(parents=True)  # as the real run_seed's stages make it
        (Path(cfg.out) / f"seed{seed}/sft_result.json").write_text(json.dumps(res))  # as run_seed writes it
        return res

    monkeypatch.setattr(E, "sh", fake_sh)
    monkeypatch.setattr(E, "solution_rows", lambda tasks, path, *a, **k: path.touch())
    monkeypatch.setattr(E, "run_seed", fake_seed)
    argv = ["--out", str(tmp_path / "run"), "--n-train", "4", "--n-heldout", "2", "--stale-frac", "0",
            "--sft-only", "--first-seed", "3", "--seeds", "2"]
    assert E.main(argv)["seeds"] == [3, 4] and ran == [3, 4]
    assert E.main(argv)["seeds"] == [3, 4] and ran == [3, 4]  # both finished: read back
    assert not (tmp_path / "run/seed0").exists()
    assert "first_seed" not in E.recipe(json.loads((tmp_path / "run/config.json").read_text()))


def test_sft_only_report_averages_the_seeds_and_skips_absent_causes(tmp_path):
    """--sft-only: results.json holds the SFT policy's figures (mean over seeds, each seed kept), the
    split's task lists and Recovery@1 by cause averaged over the seeds that had such states."""
    import experiment_learning as E

    def seed(s: int, rec: float, clash: float | None) -> dict:
        return {"seed": s, "base_pass_at_1": 0.0, "sft_pass_at_1": 0.1 * (s + 1), "sft_train_pass_at_1": 0.5,
                "heldout_recovery_before": rec, "sft_success_with_retry": 0.2, "n_heldout_failures": 70,
                "heldout_failures_stale_frac": 0.6, "code": "abc",
                "recovery_by_cause": {"before": {"file": rec, "clash": clash, "stale_removed": 0.5}}}

    split = {"train": ["a"], "dev": ["b", "c"], "heldout": ["d"], "pool": []}
    cfg = E.Config(out=str(tmp_path), eval_on="dev", sft_only=True)
    res = E.sft_report(cfg, [seed(0, 0.1, None), seed(1, 0.3, 0.5)], split, tmp_path)
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(json.dumps(res))
    assert res["sft_only"] and res["dev_tasks"] == ["b", "c"] and res["evaluated_on"] == "dev"
    assert res["sft_pass_at_1"] == pytest.approx(0.15)
    assert res["heldout_recovery_before"] == pytest.approx(0.2)
    before = res["recovery_by_cause"]["before"]
    assert before["file"] == pytest.approx(0.2) and before["clash"] == 0.5 and before["stale_removed"] == 0.5
    assert before["folder"] != before["folder"]  # no seed had such a state: nan, not 0
    assert res["code"] == ["abc"] and len(res["per_seed"]) == 2


def test_name_copy_probe_scores_the_names_written_after_the_listing_showed_them():
    """name_copy_probe: the stem and extension of every occurrence on the recovery's own tokens,
    never the dot, never a listing (which may name the entry more than once)."""
    import name_copy_probe

    ids = [5, 9, 1, 7, 3, 9, 1, 7, 4, 9, 1, 7]  # listing, then the recovery's two writes
    mask = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]
    assert name_copy_probe.name_positions(ids, mask, [9, 1, 7]) == [5, 7, 9, 11]
    # a `find` of a planted folder: the name twice in the listing, once in the removal
    ids = [9, 1, 7, 6, 9, 1, 7, 8, 3, 9, 1, 7]
    assert name_copy_probe.name_positions(ids, [0] * 8 + [1] * 4, [9, 1, 7]) == [9, 11]
    assert name_copy_probe.name_positions([9, 1, 7, 2], [0, 0, 0, 0], [9, 1, 7]) == []


def test_seed_level_t_interval_is_the_students_t_interval_of_the_seed_means():
    """The interval the README quotes: four runs' fork gains, 3 degrees of freedom (t = 3.182)."""
    import experiment_learning as E

    lo, hi = E.t_interval([0.266, 0.159, 0.085, 0.012])
    assert lo == pytest.approx(-0.043, abs=2e-3) and hi == pytest.approx(0.303, abs=2e-3)  # inputs rounded
    assert hi - lo == pytest.approx(2 * 3.182 * statistics.stdev([0.266, 0.159, 0.085, 0.012]) / 2, rel=1e-3)
    assert E.t_interval([0.5, 0.5]) == [0.5, 0.5]
    assert E.t_interval([0.3]) is None  # one seed: no interval


def test_policy_tables_give_each_policy_its_gain_both_intervals_and_each_cause():
    """The README's tables: each GRPO policy's row carries its budget, Recovery@1, gain over SFT with
    the seed-level and the task-level interval, Pass@1 and success within an attempt and a recovery;
    the cause table has a row per policy; a missing interval or cause reads '-'."""
    import experiment_learning as E

    modes = ("fork", "standard", "standard_retry")
    cause = {"file": 0.5, "folder": None, "clash": 0.25, "other": 0.0, "stale_removed": 0.4,
             "stale_removed_recovered": 0.625, "blind_removal": 0.125}
    res = {"per_seed": [{"recovery_after_samples": {m: [] for m in modes}}],
           "base_pass_at_1": 0.0, "sft_pass_at_1": 0.25, "heldout_recovery_before": 0.2,
           "heldout_recovery_after": {"fork": 0.35, "standard": 0.1, "standard_retry": 0.25},
           "heldout_pass_at_1_after": {"fork": 0.3, "standard": 0.275, "standard_retry": 0.25},
           "heldout_success_with_retry": {"base": 0.0, "sft": 0.3, "fork": 0.5, "standard": 0.35,
                                          "standard_retry": 0.4},
           "env_steps": {"fork": 3000, "standard": 3010, "standard_retry": 3050},
           "ci95_seeds": {"recovery_gain_fork": [0.05, 0.25],
                          "recovery_fork_minus_standard_retry": [-0.02, 0.22]},
           "ci95_tasks": {"recovery_gain_fork": [0.1, 0.2]},
           "recovery_by_cause": {p: cause for p in ("before", *modes)}}
    rows = E.policy_tables(res).splitlines()
    assert "| fork | 3,000 | 0.350 | +0.150 | [+0.050, +0.250] | [+0.100, +0.200] | 0.300 | 0.500 |" in rows
    assert "| standard | 3,010 | 0.100 | -0.100 | - | - | 0.275 | 0.350 |" in rows
    assert "| fork minus standard_retry | | | +0.100 | [-0.020, +0.220] | - | | |" in rows
    assert "| SFT | 0 | 0.200 | - | - | - | 0.250 | 0.300 |" in rows
    assert "| standard_retry | 0.500 | - | 0.250 | 0.000 | 0.400 / 0.625 | 0.125 |" in rows


def test_task_bootstrap_is_paired_and_keeps_each_tasks_samples_together():
    """Resampling held-out tasks, not forks: a policy equal to the SFT policy on every sample has a
    zero-width gain interval (the draw is shared), a gain present on every task has a positive one,
    and runs that kept no task per sample get no task-level interval."""
    import random

    import experiment_learning as E

    tasks = ["a", "a", "b", "b", "c", "c"]

    def seed(before, fork, standard):
        return {"recovery_sample_tasks": tasks, "recovery_before": before,
                "recovery_after_samples": {"fork": fork, "standard": standard}}

    same = [0, 1, 0, 0, 1, 1]
    ci = E.task_bootstrap([seed(same, [1, 1, 1, 1, 1, 1], same)], 200, random.Random(0))
    assert ci["recovery_gain_standard"] == [0.0, 0.0]
    assert 0 < ci["recovery_gain_fork"][0] <= ci["recovery_gain_fork"][1] <= 1
    assert E.task_bootstrap([{"recovery_before": [1.0]}], 50, random.Random(0)) is None
    # the policies are the ones every seed has, fork first, whichever modes a run trained
    retry_only = {"recovery_after_samples": {"standard_retry": [1], "fork": [0]}}
    assert E.modes_of([retry_only]) == ("fork", "standard_retry")
    assert E.modes_of([retry_only, seed(same, same, same)]) == ("fork",)
