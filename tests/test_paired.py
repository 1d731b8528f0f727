"""The paired learning experiment (bench/experiment_paired.py): its pre-registered analysis on
hand-computed values, pooling from replicate files alone, and the bank's rebuild by replay."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import experiment_paired as P  # noqa: E402
import microtasks  # noqa: E402

import common as C  # noqa: E402

# Student-t quantiles from a printed table: t(0.995, 3) = 5.841, t(0.975, 7) = 2.365
PLAN = {"looks": [4, 8], "nominal_alpha": [0.01, 0.05], "alpha": 0.05, "futility_margin": 0.03,
        "forks_per_state": 2, "mdd": 0.05}


def test_t_quantile_matches_the_printed_table():
    assert P.t_quantile(0.995, 3) == pytest.approx(5.841, abs=1e-3)
    assert P.t_quantile(0.975, 7) == pytest.approx(2.365, abs=1e-3)
    # MDD at 8 replicates, SD 0.02, two-sided 0.05, 80% power: (2.365 + t(0.8, 7) = 0.896) * 0.02 / sqrt 8
    assert P.mdd(0.02, 8, 0.05) == pytest.approx((2.365 + 0.896) * 0.02 / 8 ** 0.5, abs=2e-4)


@pytest.mark.parametrize("diffs, decision, interval", [
    # mean 0.1, sd 0.01633: 0.1 -+ 5.841 * 0.01633 / 2 = [0.0523, 0.1477]: excludes 0
    ([0.1, 0.12, 0.08, 0.1], "efficacy: fork better", [0.0523, 0.1477]),
    ([-0.1, -0.12, -0.08, -0.1], "efficacy: standard_retry better", [-0.1477, -0.0523]),
    # mean 0, sd 0.008165: [-0.0238, 0.0238]; the upper bound is below the futility margin 0.03
    ([0.01, -0.01, 0.0, 0.0], "futility", [-0.0238, 0.0238]),
    # mean 0, sd 0.04082: [-0.1192, 0.1192]: neither bound crossed at the first look
    ([0.05, -0.05, 0.0, 0.0], "continue", [-0.1192, 0.1192]),
])
def test_sequential_verdict_at_the_first_look(diffs, decision, interval):
    v = P.verdict(diffs, PLAN)
    assert v["decision"] == decision and v["look"] == 4
    assert v["interval"] == pytest.approx(interval, abs=2e-4)


def test_verdict_at_the_last_look_and_before_the_first():
    assert P.verdict([0.1, 0.2], PLAN)["decision"] == "continue"
    # first look: mean 0, sd 0.04082 -> continue; last look (8): mean 0.0125, squared deviations sum
    # to 0.01875, sd sqrt(0.01875 / 7) = 0.05175; 0.0125 -+ 2.365 * 0.05175 / sqrt 8 = [-0.0308, 0.0558]
    diffs = [0.05, -0.05, 0.0, 0.0, 0.05, -0.05, 0.1, 0.0]
    v = P.verdict(diffs, PLAN)
    assert v["look"] == 8 and v["decision"] == "no detectable difference"
    assert v["interval"] == pytest.approx([-0.0308, 0.0558], abs=2e-4)


def replicate(r: int, fork: list[float], retry: list[float], sft: list[float]) -> dict:
    """A replicate.json as run_replicate writes it (2 states x 2 forks)."""
    def point(step: int, xs: list[float]) -> dict:
        return {"grpo_step": step, "env_steps": 100 * step, "recovery": sum(xs) / len(xs)}
    rec = sum(sft) / len(sft)
    return {"replicate": r, "block": "runs/b", "block_seed": 0, "task_seed": 5, "evaluated_on": "heldout",
            "code": "abc124",
            "sft": {"recovery": rec, "samples": sft, "sample_tasks": ["a", "a", "b", "b"],
                    "forks_per_state": 2},
            "env_steps": {"fork": 1600, "standard_retry": 1590}, "env_steps_pool": 80,
            "curves": {"fork": [{"grpo_step": 0, "env_steps": 0, "recovery": rec}, point(16, fork)],
                       "standard_retry": [{"grpo_step": 0, "env_steps": 0, "recovery": rec},
                                          point(16, retry)]},
            "samples": {"fork": fork, "standard_retry": retry},
            "by_cause": {a: {"stale": 0.5} for a in P.ARMS},
            "secondary": {a: {"pass_at_1": 0.5, "success_with_retry": 0.6} for a in P.ARMS},
            "nonuniform_group_frac": {a: 0.5 for a in P.ARMS}}


def test_combine_pools_replicate_files_alone_under_the_plan(tmp_path):
    sft = [0.0, 1.0, 0.0, 0.0]
    reps = [replicate(0, [1, 1, 0, 1], [1, 0, 0, 0], sft), replicate(1, [1, 0, 1, 1], [0, 0, 1, 1], sft),
            replicate(2, [1, 1, 1, 1], [1, 1, 0, 0], sft), replicate(3, [0, 1, 1, 1], [1, 0, 0, 1], sft)]
    for r in reps:
        (tmp_path / f"rep{r['replicate']}").mkdir()
        (tmp_path / f"rep{r['replicate']}/replicate.json").write_text(json.dumps(r))
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    res = P.main(["--combine", str(tmp_path), "--plan", str(tmp_path / "plan.json"), "--out",
                  str(tmp_path / "pooled"), "--bootstrap", "500"])
    assert res["replicates"] == 4 and res["arms"] == ["fork", "standard_retry"]
    assert res["bank_states"] == 2 and res["forks_per_state"] == 2 and res["grpo_steps"] == 16
    assert res["sft_bank_recovery"] == 0.25 and res["env_steps"] == {"fork": 1600, "standard_retry": 1590}
    # per replicate fork - standard_retry: 0.75-0.25, 0.75-0.5, 1-0.5, 0.75-0.5
    assert res["diffs"] == pytest.approx([0.5, 0.25, 0.5, 0.25])
    assert res["fork_minus_standard_retry"] == pytest.approx(0.375)
    # sd 0.1443: 0.375 -+ 5.841 * 0.1443 / 2 = [-0.047, 0.797]: four replicates this noisy go on
    assert res["verdict"]["decision"] == "continue"
    assert res["verdict"]["interval"] == pytest.approx([-0.0465, 0.7965], abs=3e-4)
    assert res["curves"]["fork"][1] == pytest.approx({"grpo_step": 16, "env_steps": 1600, "recovery": 0.8125,
                                                      "min": 0.75, "max": 1.0, "n": 4})
    assert res["mdd"] == 0.05 and (tmp_path / "pooled/curves.png").stat().st_size > 0
    lo, hi = res["ci95_bootstrap"]
    assert 0.0 <= lo <= 0.375 <= hi <= 0.75  # every resampled difference lies in [0, 0.75] here
    stored = json.loads((tmp_path / "pooled/results.json").read_text())
    assert stored["verdict"] == res["verdict"]
    for change, message in (({"forks_per_state": 4}, "forks every bank state 4 times"),
                            ({"frozen_commit": "abc123"}, "not at the plan's frozen commit abc123"),
                            ({"task_seed": 6}, "task_seed 5; the plan says 6"),
                            ({"evaluated_on": "dev"}, "evaluated_on 'heldout'; the plan says 'dev'"),
                            ({"grpo_steps": 32}, "grpo_steps 16; the plan says 32"),
                            ({"bank_states": 80}, "bank_states 2; the plan says 80")):
        (tmp_path / "plan2.json").write_text(json.dumps(PLAN | change))
        with pytest.raises(SystemExit, match=message):
            P.main(["--combine", str(tmp_path), "--plan", str(tmp_path / "plan2.json"), "--out",
                    str(tmp_path / "x")])


def test_require_commit_refuses_a_replicate_off_the_frozen_commit_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit, match="--require-commit 0000000: this checkout is at"):
        P.main(["--block", str(tmp_path / "no-block"), "--out", str(tmp_path / "run"), "--require-commit",
                "0000000"])
    assert not (tmp_path / "run").exists()


def test_paired_bootstrap_keeps_a_states_arms_together():
    """Every state's fork and standard_retry differ by exactly 0.5, so every paired draw gives 0.5;
    resampling the arms' states independently would not."""
    rep = {"per_state": [(1.0, 0.5), (0.5, 0.0), (0.75, 0.25), (0.5, 0.0)]}
    assert P.paired_bootstrap([rep, rep], 200, random.Random(1)) == pytest.approx([0.5, 0.5])
    assert P.per_state({"samples": {"fork": [1, 0, 1, 1], "standard_retry": [0, 0, 1, 0]}}, 2) == [
        (0.5, 0.0), (1.0, 0.5)]


def test_replicate_runs_its_chunks_to_each_curve_point_and_gives_standard_retry_the_forks_steps(
        tmp_path, monkeypatch):
    """run_replicate's schedule with the stages stubbed: 5 GRPO steps at --eval-every 2 are chunks
    to steps 2, 4 and 5 (the end-to-end test runs one chunk); intermediate points fork each bank
    state --curve-forks times, the last as often as SFT did, and only it gives the samples; each
    chunk's standard_retry budget is the fork arm's environment steps, stage 03's pool included."""
    E = P.E
    seed_dir = tmp_path / "block/seed0"
    C.append_jsonl(seed_dir / "failures_train/attempts.jsonl", {"task": "plain", "reward": 1.0})
    ecfg = E.Config(recovery_samples=4, eval_on="dev")
    b = {"run": tmp_path / "block", "seed_dir": seed_dir, "ecfg": ecfg, "model": tmp_path / "sft",
         "tasks": tmp_path / "tasks", "split": {"causes": {}},
         "sft": {"recovery_before": [0.0, 1.0, 0.0, 0.0], "recovery_sample_tasks": ["t"] * 4}}
    calls = []

    def pool(args, log):  # stage 03: two first attempts of 3 and 4 turns
        out = Path(args[args.index("--out") + 1])
        for turns in (3, 4):
            C.append_jsonl(out / "attempts.jsonl", {"task": "t", "turns": turns, "reward": 0.0})

    def chunk(cfg, mode, sft, out, steps, budget, tasks_dir, failures, seed, last, log):
        calls.append((mode, steps, budget, last))
        C.append_jsonl(out / "metrics.jsonl", {"groups": 2, "groups_dropped": 1})
        return 10 * steps if mode == "fork" else budget + 1  # standard_retry: the step that crosses it

    def recovery(cfg, model, bank, tasks, seed):
        return [1.0] * cfg.recovery_samples, [[] for _ in range(cfg.recovery_samples)]

    monkeypatch.setattr(P, "replay_bank", lambda b, out, n: out / "bank.jsonl")
    monkeypatch.setattr(E, "sh", pool)
    monkeypatch.setattr(E, "grpo_chunk", chunk)
    monkeypatch.setattr(E, "recovery_at_1", recovery)
    monkeypatch.setattr(E, "load_causes", lambda tasks: {})
    monkeypatch.setattr(C, "remove_snapshots", lambda *files: 0)
    cfg = P.Config(out=str(tmp_path / "out"), grpo_steps=5, eval_every=2, curve_forks=1, secondary=False)
    rep = P.run_replicate(cfg, b, 3)
    assert calls == [("fork", 2, 0, False), ("standard_retry", 10**6, 27, False),
                     ("fork", 4, 0, False), ("standard_retry", 10**6, 47, False),
                     ("fork", 5, 0, True), ("standard_retry", 10**6, 57, True)]
    assert rep["env_steps_pool"] == 7 and rep["env_steps"] == {"fork": 57, "standard_retry": 58}
    for arm, steps in (("fork", [0, 27, 47, 57]), ("standard_retry", [0, 28, 48, 58])):
        assert [p["grpo_step"] for p in rep["curves"][arm]] == [0, 2, 4, 5]
        assert [p.get("forks_per_state") for p in rep["curves"][arm]] == [None, 1, 1, 4]
        assert [p["env_steps"] for p in rep["curves"][arm]] == steps
        assert rep["samples"][arm] == [1.0] * 4 and rep["nonuniform_group_frac"][arm] == 0.5
    assert rep["curves"]["fork"][0]["recovery"] == 0.25 and rep["gate"]["plain_pass"] == 1.0
    assert len(C.read_jsonl(tmp_path / "out/rep3/progress.jsonl")) == 6


def test_the_block_rule_reads_the_exact_bank_share_and_refuses_a_block_outside_it(tmp_path, capsys):
    """The plan's block rule on a block's own files: the gate (train first attempts without an entry)
    and the bank Recovery@1 as counted, never rounded: 115 of 768 forks is 0.1497, outside [0.15, 0.7]
    (held-out seed 1's block, whose report printed 0.150). --keep-block says so; a replicate refuses."""
    run, seed = tmp_path / "block", tmp_path / "block/seed1"
    (seed / "sft/final").mkdir(parents=True)
    (run / "tasks").mkdir()
    for f in ("config.json", "results.json"):
        (run / f).write_text(json.dumps({"entry_split": True}))
    causes = {"twin": {"kind": "file", "path": "/app/x"}}  # the gate reads the tasks without an entry
    (run / "tasks/split.json").write_text(json.dumps({"causes": causes}))
    for f in ("failures_heldout/failures.jsonl", "failures_heldout/attempts.jsonl"):
        C.append_jsonl(seed / f, {"task": "twin", "reward": 0.0})
    for task, reward in (("plain", 1.0), ("plain", 1.0), ("plain", 0.0), ("twin", 0.0)):
        C.append_jsonl(seed / "failures_train/attempts.jsonl", {"task": task, "reward": reward})

    def block(recovered: int, *flags: str) -> list[str]:  # a bank of 768 forks, `recovered` of them
        sft = {"recovery_before": [1.0] * recovered + [0.0] * (768 - recovered)}
        (seed / "sft_result.json").write_text(json.dumps(sft))
        return ["--block", str(run), "--block-seed", "1", "--out", str(tmp_path / "out"), *flags]

    with pytest.raises(SystemExit, match=r"bank Recovery@1 is 115/768 = 0\.1497, outside \[0\.15, 0\.7\]"):
        P.main(block(115))
    gate = json.loads((tmp_path / "out/gate.json").read_text())
    assert gate["plain_pass"] == 2 / 3 and (gate["bank_recovered"], gate["bank_forks"]) == (115, 768)
    with pytest.raises(SystemExit, match=r"first attempts pass 0\.667 .*< 0\.7"):
        P.main(block(116, "--gate-plain-pass", "0.7"))
    with pytest.raises(SystemExit, match="= 0\\.7005, outside"):
        P.main(block(538))
    capsys.readouterr()
    P.main(block(115, "--keep-block", str(tmp_path / "kept")))
    assert "block rule: fails: its bank Recovery@1 is 115/768 = 0.1497" in capsys.readouterr().out
    P.main(block(116, "--keep-block", str(tmp_path / "kept")))
    out = capsys.readouterr().out
    assert "block rule: passes (plain pass 0.667 of 3, bank Recovery@1 116/768 = 0.1510)" in out
    with pytest.raises(SystemExit, match="give LOW,HIGH"):
        P.main(block(116, "--bank-range", "0.15"))
    # the defaults are the pre-registered plan's rule
    rule = json.loads((ROOT / "bench/prereg_paired.json").read_text())["block"]
    assert P.Config().gate_plain_pass == rule["gate_plain_pass"]
    assert [float(x) for x in P.Config().bank_range.split(",")] == rule["sft_bank_recovery_range"]


def test_replay_rebuilds_a_bank_state_with_the_failed_attempts_files(docker_ready, tmp_path):
    """A bank whose snapshot image is gone is rebuilt by replaying the attempt's commands: the
    rebuilt snapshot holds the same files under /app as a snapshot of the original attempt."""
    cause = microtasks.stale_cause("folder", "junk.dat", "elk")
    name = microtasks.write_task(tmp_path / "tasks/heldout", "write", "apple", "elk", "", stale=cause)
    task = C.load_task(tmp_path / "tasks/heldout" / name)
    cmds = ["mkdir -p /app/out", "cd /app/out", "echo apple > elk.txt"]
    listing = "find /app -printf '%p %s\\n' | sort; pwd"
    with C.env_session():
        with C.start_env(task, internet=False) as env:
            for c in cmds:
                env.bash(c)
            original = env.bash(listing).output
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": task.instruction}]
        messages += [{"role": "assistant", "content": "", "tool_calls": [C.tool_call("bash", {"command": c})]}
                     for c in cmds]
        (tmp_path / "bank.jsonl").write_text(json.dumps({"id": "s1", "task": name, "snapshot":
                                                          "reterm-snap/gone:0", "messages": messages}) + "\n")
        b = {"bank": tmp_path / "bank.jsonl", "tasks": tmp_path / "tasks",
             "ecfg": type("Cfg", (), {"eval_on": "heldout"})}
        path = P.replay_bank(b, tmp_path / "rep0", 2)
        row = C.read_jsonl(path)[0]
        try:
            assert row["snapshot"] != "reterm-snap/gone:0" and row["messages"] == messages
            with C.start_env(task, image=row["snapshot"], internet=False) as env:
                assert env.bash(listing).output == original  # the same files, and the same cwd
            assert P.replay_bank(b, tmp_path / "rep0", 2) == path  # live: nothing rebuilt
            assert C.read_jsonl(path)[0]["snapshot"] == row["snapshot"]
        finally:
            C.remove_snapshots(path)


@pytest.mark.slow
def test_a_toy_block_and_replicate_run_end_to_end_and_keep_the_twins_out_of_training(learning_run, tmp_path):
    """The toy learning run (learning_run: `experiment_learning.py --entry-split --sft-only`, dev twins)
    as a block, then one paired replicate on it: the replicate.json contract, both arms at the fork arm's
    environment steps, and no dev/held-out twin, nor any planted name of theirs, in an SFT row, the
    fork pool or a GRPO group of either arm."""
    block = learning_run[0]
    # the block as it is committed (no tasks/, data/ or base model): replicates write the tasks again
    kept = tmp_path / "kept"
    P.main(["--block", str(block), "--keep-block", str(kept)])
    assert not (kept / "tasks").exists() and (kept / "seed0/sft/final/config.json").exists()
    out = tmp_path / "paired"
    # --no-secondary: 05 on the twins is the learning run's pass_at_1 and success_with_retry, which
    # learning_run runs end to end already (its base policy's). One chunk (no intermediate curve point): the
    # schedule over several is test_replicate_runs_its_chunks_to_each_curve_point...
    done = P.main(["--block", str(kept), "--out", str(out), "--replicates", "7", "--grpo-steps", "1",
                   "--eval-every", "1", "--gate-plain-pass", "0", "--bank-range", "0,1", "--no-secondary"])
    assert (out / "tasks/split.json").read_text() == (block / "tasks/split.json").read_text()
    rep = json.loads((out / "rep7/replicate.json").read_text())
    assert done[7] == rep and rep["replicate"] == 7 and rep["evaluated_on"] == "dev"
    assert rep["block"] == str(kept) and rep["gate"]["n_plain_attempts"] > 0
    assert rep["secondary"] == {} and not (out / "rep7/eval_fork").exists()
    split = json.loads((block / "tasks/split.json").read_text())
    sft = json.loads((block / "seed0/sft_result.json").read_text())
    n = len(sft["recovery_before"])
    assert n == 2 * len(C.read_jsonl(block / "seed0/failures_heldout/failures.jsonl")) > 0  # forked twice
    assert rep["sft"]["samples"] == sft["recovery_before"] and rep["sft"]["forks_per_state"] == 2
    for arm in P.ARMS:
        assert [p["grpo_step"] for p in rep["curves"][arm]] == [0, 1]
        assert [p.get("forks_per_state") for p in rep["curves"][arm]] == [None, 2]
        assert len(rep["samples"][arm]) == n  # the final point forks every state as often as SFT's
        assert rep["curves"][arm][-1]["recovery"] == sum(rep["samples"][arm]) / n
    # standard_retry ran to the fork arm's environment steps, whose budget counts stage 03's pool
    assert 0 < rep["env_steps_pool"] < rep["env_steps"]["fork"] <= rep["env_steps"]["standard_retry"]
    twins = set(split["heldout"]) | set(split["dev"])
    names = {Path(split["causes"][t]["path"]).name for t in twins if split["causes"][t]["kind"] != "clash"}
    rows = [r for f in ("sft.jsonl", "warmup.jsonl") if (block / "data" / f).exists()
            for r in C.read_jsonl(block / "data" / f)]
    assert rows and not {r["task_id"] for r in rows} & twins
    assert not [n for n in names for r in rows if n in json.dumps(r["messages"])]
    pooled = {r["task"] for r in C.read_jsonl(out / "rep7/pool/attempts.jsonl")}
    grouped = {g["task"] for arm in P.ARMS for r in C.read_jsonl(out / f"rep7/{arm}/metrics.jsonl")
               for g in r["group_rewards"]}
    assert pooled and grouped and not (pooled | grouped) & twins
    # the bank's rebuilt snapshots and the pool's are removed when the replicate ends
    tags = {r["snapshot"] for f in ("bank.jsonl", "pool/failures.jsonl")
            for r in C.read_jsonl(out / "rep7" / f)}
    images = C.docker_client().images.list(filters={"label": "reterm.kind=snapshot"})
    assert tags and not tags & {t for i in images for t in i.tags}
