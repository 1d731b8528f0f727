"""Stage 04: the GRPO math against hand-computed numbers, the forked-rollout mask, a learning
test on a synthetic verifiable reward, one end-to-end step with real forks that resumes, main's loop
(budget, resume, --kl-beta, final/) with its rollouts replaced, and --verify-fresh in real containers."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import math
import types

import batch_rollouts as R
import pytest
import torch
from conftest import ScriptedEngine, call

import common as C

G = importlib.import_module("04_reterm_grpo")


# ── the math, by hand ──────────────────────────────────────────────────────


def test_group_advantages_by_hand():
    s3 = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    half = torch.tensor([0.5, -0.5, -0.5, 0.5])
    assert torch.allclose(G.group_advantages([1, 0, 0, 1]), half / (s3 + 1e-6))
    # [1, 0, 0, 0]: mean 0.25, unbiased var (0.75² + 3·0.25²) / 3 = 0.25 -> std 0.5
    assert torch.allclose(G.group_advantages([1, 0, 0, 0]), torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)
    dr = G.group_advantages([1, 0, 0, 0], use_std=False)
    assert torch.allclose(dr, torch.tensor([0.75, -0.25, -0.25, -0.25]))
    assert torch.equal(G.group_advantages([1.0, 1.0, 1.0]), torch.zeros(3))  # all equal: no signal
    two = G.group_advantages([[1, 0, 0, 0], [0.5, 0.5, 0.5, 0.5]])  # one group per row
    assert torch.allclose(two[0], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5) and not two[1].any()


def test_uniform_groups_are_dropped_and_counted():
    ep = lambda r: C.Episode(task=None, messages=[], trace=C.TokenTrace(), reward=r)
    groups = [G.Group("fork", str(i), "x", g) for i, g in
              enumerate([[ep(1), ep(1)], [ep(0), ep(1)], [ep(0), ep(0)], [ep(0.5), ep(0)]])]
    kept, dropped = G.drop_uniform_groups(groups)
    assert dropped == 2 and kept == [groups[1], groups[3]]


def test_clipped_policy_loss_by_hand():
    ratios = torch.tensor([[1.5, 0.5, 1.0], [1.5, 0.5, 1.2]])
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.0, -2.0]])
    logp = (old + ratios.log()).requires_grad_()
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss = G.clipped_policy_loss(logp, old, adv, mask)
    # A=+1: 1.5 clips to 1.28 (upper side), 0.5 is not clipped (the min keeps 0.5), 1.0 -> 1.0
    # A=-2: 1.5 is not clipped (min keeps -3), 0.5 clips to 0.8 (lower side: -1.6), 1.2 is masked
    expect = (-1.28 - 0.5 - 1.0 + 3.0 + 1.6) / 5
    assert loss.item() == pytest.approx(expect, abs=1e-6)
    loss.backward()
    # clipped tokens and the masked token get no gradient; others -A·ρ / Σmask
    grad = torch.tensor([[0.0, -0.5 / 5, -1.0 / 5], [2 * 1.5 / 5, 0.0, 0.0]])
    assert torch.allclose(logp.grad, grad, atol=1e-6)
    # token-level normalisation: a masked token's value, however extreme, changes nothing
    wild = logp.detach().clone()
    wild[1, 2] = 30.0
    assert G.clipped_policy_loss(wild, old, adv, mask).item() == pytest.approx(expect, abs=1e-6)
    # per-token weights (the truncated IS weight) scale each token's term
    w = torch.tensor([[2.0, 1.0, 1.0], [1.0, 0.5, 1.0]])
    weighted = (-1.28 * 2 - 0.5 - 1.0 + 3.0 + 1.6 * 0.5) / 5
    assert G.clipped_policy_loss(logp.detach(), old, adv, mask, is_weights=w).item() == pytest.approx(
        weighted)
    # custom clip range: eps_high 0.6 lets 1.5 through for A>0
    assert G.clipped_policy_loss(logp.detach(), old, adv, mask, 0.2, 0.6).item() == pytest.approx(
        (-1.5 - 0.5 - 1.0 + 3.0 + 1.6) / 5)


def test_k3_and_truncated_importance_weight():
    lp = torch.tensor([-1.0, -2.0])
    assert torch.allclose(G.k3_kl(lp, lp), torch.zeros(2))
    assert G.k3_kl(torch.tensor([0.0]), torch.tensor([math.log(2)])).item() == pytest.approx(1 - math.log(2))
    w = G.truncated_is_weight(torch.tensor([math.log(3), math.log(1.5)]), torch.zeros(2), cap=2.0)
    assert torch.allclose(w, torch.tensor([2.0, 1.5]))


def _ep(reward: float, token: int, error: str | None = None) -> C.Episode:
    """A finished attempt by hand: one sampled token (its id names the row), a reward, maybe an error."""
    trace = C.TokenTrace()
    trace.add_sampled([token], [-0.5], trained=True)
    return C.Episode(task=None, messages=[], trace=trace, reward=reward, error=error, turns=1)


def _first_three_steps(groups: list, *argv: str):
    """Stage 04's steps 1-3 on hand-built groups, as main runs them (environment failures dropped →
    uniform groups dropped → rows with their advantages), and the step's metrics; returns (rows,
    metrics)."""
    cfg = C.parse_config(G.Config, ["--model", "m", "--out", "o", "--groups-per-step", str(len(groups)),
                                    *argv])
    errors = G.drop_env_failures(groups)
    kept, dropped = G.drop_uniform_groups(groups)
    return G.group_rows(kept, cfg.adv_std), G.step_metrics(groups, dropped, G.FailurePool(cfg.floor)) | {
        "env_errors": errors}


def test_standard_retry_pairs_share_their_samples_advantage_and_an_errored_retry_goes():
    """Each failed attempt and its recovery are one sample with the recovery's reward; both rows
    carry that sample's advantage. Recovery rewards [1, 0] (unbiased std 1/√2): ±1/√2 on both rows of
    each pair. A sample whose recovery hit an environment error is dropped before the advantages."""
    a = G.Group("fresh", "t", "fresh", [_ep(0, 1), _ep(0, 3), _ep(0, 5)], "t",
                retries=[_ep(1, 2), _ep(0, 4), _ep(0, 6, error="exec failed")])
    b = G.Group("fresh", "t", "fresh", [_ep(1, 7), _ep(0, 8)], "t", retries=[None, _ep(0, 9)])
    rows, metrics = _first_three_steps([a, b], "--mode", "standard_retry")  # --adv-std (default)
    h = 1 / math.sqrt(2)
    assert [(r.trace.ids[0], r.adv) for r in rows] == [
        (1, pytest.approx(h, abs=1e-5)), (2, pytest.approx(h, abs=1e-5)),  # failed → recovered: +
        (3, pytest.approx(-h, abs=1e-5)), (4, pytest.approx(-h, abs=1e-5)),  # failed → failed again: −
        (7, pytest.approx(h, abs=1e-5)),  # passed at once: no recovery, one row
        (8, pytest.approx(-h, abs=1e-5)), (9, pytest.approx(-h, abs=1e-5))]
    assert metrics["env_errors"] == 1 and metrics["retry_recovery"] == pytest.approx(1 / 3)
    assert [g["rewards"] for g in metrics["group_rewards"]] == [[1.0, 0.0], [1.0, 0.0]]
    rows, _ = _first_three_steps([a, b], "--mode", "standard_retry", "--no-adv-std")  # Dr. GRPO
    assert [r.adv for r in rows] == [0.5, 0.5, -0.5, -0.5, 0.5, -0.5, -0.5]


def test_step_metrics_reward_is_the_mean_over_samples_and_dropped_counts_uniform_groups():
    """Computed from the groups by hand: groups of unequal size (the mean over samples is not the
    mean of group means) and one group made uniform by dropping its environment error."""
    groups = [G.Group("fork", "s1", "c", [_ep(1, 1), _ep(0, 2), _ep(0, 3)], "t"),
              G.Group("fork", "s2", "c", [_ep(1, 4), _ep(1, 5)], "t"),  # uniform
              G.Group("fresh", "t", "fresh", [_ep(0, 6)] * 4, "t"),  # uniform
              G.Group("fresh", "t", "fresh", [_ep(1, 7), _ep(0, 8)], "t"),
              G.Group("fresh", "t", "fresh", [_ep(1, 9), _ep(1, 10), _ep(0, 11, error="boom")], "t")]
    rows, m = _first_three_steps(groups, "--mode", "fork", "--fresh-frac", "1")
    assert m["reward"] == pytest.approx(6 / 13)  # 1+0+0 + 1+1 + 0·4 + 1+0 + 1+1, over 13 samples
    assert m["groups"] == 5 and m["groups_dropped"] == 3
    flat = [r for g in m["group_rewards"] for r in g["rewards"]]  # the record agrees with itself
    assert m["reward"] == pytest.approx(sum(flat) / len(flat))
    assert m["groups_dropped"] == sum(len(set(g["rewards"])) == 1 for g in m["group_rewards"])
    assert m["recovery"] == pytest.approx(3 / 5) and m["fresh_pass"] == pytest.approx(3 / 8)
    assert [r.trace.ids[0] for r in rows] == [1, 2, 3, 7, 8]  # the kept groups' samples only


@pytest.mark.parametrize("rule", ["learnable", "hard"])
def test_pool_sampling_follows_its_rule_and_retires_mastered(rule):
    import random

    w = G.sampling_weight
    assert w([], 0.1, rule) == 1.0  # unseen
    assert w([0.5, 0.125], 0.1, rule) == (0.4375 if rule == "learnable" else 0.875)  # latest group
    assert w([0.0], 0.1, rule) == (0.1 if rule == "learnable" else 1.0)  # all failed: floor / top
    hist = {"done": [1.0], "half": [0.5], "none": [0.0], "new": []}
    rng = random.Random(0)
    counts = {k: 0 for k in hist}
    sampler = G.FailurePool(0.1, rule, hist=hist)
    for _ in range(4000):
        counts[sampler.sample(list(hist), 1, rng)[0]] += 1
    if rule == "learnable":  # weights 0.1 : 1 : 0.1 : 1
        assert min(counts["half"], counts["new"]) > 5 * max(counts["none"], counts["done"]) > 0
    else:  # weights 0.1 : 0.5 : 1 : 1
        assert min(counts["new"], counts["none"]) > counts["half"] > counts["done"] > 0
    states = {k: {"state": {"snapshot": f"reterm-none/{k}:x"}, "added": i} for i, k in enumerate("abc")}
    pool = G.FailurePool(0.1, rule, states=states, hist={"a": [1.0, 1.0], "b": [0.0], "c": [0.5]})
    kept, trimmed = ("c", "b") if rule == "learnable" else ("b", "c")  # above pool_max: lowest weight leaves
    assert pool.prune(retire_after=2, pool_max=1) == ["a", trimmed] and list(pool.states) == [kept]


def test_update_pool_absorbs_each_new_failure_once_records_every_group_and_prunes(monkeypatch):
    """Step 7 on hand-built groups: a fresh group's failed attempts (kept as snapshots) join the pool,
    except the very same failed attempt twice (one image is enough) and one whose prefix leaves no
    recovery room (counted as skipped_long): both images are removed. A fork group's attempts never
    join; every group's success rate joins its start's history; a mastered state leaves."""
    removed = []
    monkeypatch.setattr(C, "remove_image", lambda image, host=None: removed.append(image))

    def failed(text: str, snapshot: str | None) -> C.Episode:
        return C.Episode(task=types.SimpleNamespace(name="t"), trace=C.TokenTrace(), snapshot=snapshot,
                         messages=[{"role": "assistant", "content": text}], category="gave_up_early", turns=1)
    fresh = G.Group("fresh", "t", "fresh", [failed("a", "img/a"), failed("a", "img/a2"),
                                            failed("long", "img/l"), _ep(1, 1)], "t")
    fork = G.Group("fork", "old", "timeout", [failed("x", "img/x"), _ep(1, 2)], "t")
    cfg = C.parse_config(G.Config, ["--model", "m", "--out", "o", "--retire-after", "1"])
    pool = G.FailurePool(cfg.floor)
    pool.add(C.FailureState("old", "t", "img/old", [], [1], "timeout"), "img/old", 0)
    pool.add(C.FailureState("won", "t", "img/won", [], [1], "timeout"), "img/won", 0)
    pool.hist["won"] = [1.0]
    stats = G.update_pool(pool, [fresh, fork], 3, cfg, lambda s: s.messages[0]["content"] != "long")
    new = [s for s in pool.states.values() if s["added"] == 3]
    assert stats == {"added": 1, "states_lost": 0, "retired": 1, "pool": 2}
    assert [s["state"]["snapshot"] for s in new] == ["img/a"] and sorted(pool.states) == sorted(
        ["old", new[0]["state"]["id"]])
    assert sorted(removed) == ["img/a2", "img/l", "img/won"] and pool.skipped_long == 1
    assert pool.hist["t"] == [0.25] and pool.hist["old"] == [0.5]


# ── a learning test: GRPO on a synthetic verifiable reward ─────────────────


def _bandit(model_dir, sign: float, steps: int = 6) -> list[float]:
    """Reward 1 iff the first sampled token is in a fixed 10% of the vocabulary; train with the
    stage's own advantages, loss and optimizer step; return P(reward) after each step."""
    torch.manual_seed(0)
    model = C.load_model(model_dir)
    tok = C.load_tokenizer(model_dir)
    prompt = tok.encode("<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n")
    good = torch.randperm(len(tok), generator=torch.Generator().manual_seed(1))[: len(tok) // 10]
    cfg = C.parse_config(G.Config, ["--model", "m", "--out", "o", "--lr", "1e-2", "--updates", "2"])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def p_good() -> tuple[float, torch.Tensor]:
        with torch.no_grad():
            probs = model(torch.tensor([prompt])).logits[0, -1].float().softmax(-1)
        return probs[good].sum().item(), probs

    hist = [p_good()[0]]
    for step in range(1, steps + 1):
        _, probs = p_good()
        rows = []
        for _g in range(4):
            acts = torch.multinomial(probs, 16, replacement=True)
            rewards = torch.isin(acts, good).float()
            if rewards.min() == rewards.max():
                continue
            for a, adv in zip(acts.tolist(), G.group_advantages(rewards), strict=True):
                trace = C.TokenTrace()
                trace.add_context(prompt)
                trace.add_sampled([a], [probs[a].log().item()], trained=True)
                rows.append(G.Row(trace, sign * adv.item()))
        if rows:
            stats = G.train_on_batch(model, opt, rows, cfg, torch.device("cpu"), tok.pad_token_id, step=step)
            assert stats["train_tokens"] == len(rows) and 0 <= stats["clip_frac"] <= 1
        hist.append(p_good()[0])
    return hist


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return C.make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", arch="qwen3")


def test_the_trainer_scores_tokens_at_the_rollout_temperature(tiny):
    """Tokens sampled at --temperature 2 with the engine's logprobs (softmax(logits / 2)): the trainer's
    π_old must be that same distribution, so the mismatch KL is 0 and the IS weight 1."""
    model, tok = C.load_model(tiny), C.load_tokenizer(tiny)
    prompt = tok.encode("<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n")
    with torch.no_grad():
        logp = (model(torch.tensor([prompt])).logits[0, -1].float() / 2.0).log_softmax(-1)
    acts = torch.multinomial(logp.exp(), 8, replacement=True, generator=torch.Generator().manual_seed(0))
    rows = []
    for a, adv in zip(acts.tolist(), [1.0, -1.0] * 4, strict=True):
        trace = C.TokenTrace()
        trace.add_context(prompt)
        trace.add_sampled([a], [logp[a].item()], trained=True)
        rows.append(G.Row(trace, adv))
    for temp, matches in ((2.0, True), (1.0, False)):  # 1.0: what the trainer scored before
        argv = ["--model", "m", "--out", "o", "--lr", "0", "--temperature", str(temp)]
        cfg = C.parse_config(G.Config, argv)
        opt = torch.optim.AdamW(model.parameters(), lr=0.0)
        stats = G.train_on_batch(model, opt, rows, cfg, torch.device("cpu"), tok.pad_token_id, step=1)
        assert (stats["mismatch_kl"] < 1e-6) == matches, (temp, stats)
        assert (abs(stats["is_weight"] - 1) < 1e-4) == matches, (temp, stats)


@pytest.mark.slow
def test_grpo_learns_a_verifiable_reward_and_the_flipped_sign_unlearns_it(tiny):
    up = _bandit(tiny, +1.0)
    down = _bandit(tiny, -1.0)
    assert up[0] == pytest.approx(down[0])
    assert up[-1] > 1.8 * up[0], up  # P(reward) 0.10 -> 0.26 here
    assert down[-1] < 0.5 * down[0], down  # 0.10 -> 0.03


# ── real Docker: forked-rollout masks, one end-to-end step ─────────────────



@pytest.mark.slow
@pytest.mark.usefixtures("docker_ready")
def test_forked_rollout_mask_covers_only_the_recovery_attempts_sampled_tokens(make_task, tiny):
    tok = C.load_tokenizer(tiny)
    task = C.load_task(make_task("mask"))
    rcfg = C.RolloutConfig(max_turns=2, max_context=8192, concurrency=4)
    with C.env_session():
        (ep,), _ = R.run_attempts([task], ScriptedEngine(tok, [call("echo no > /app/out.txt")] * 2), rcfg,
                                  commit="failed")
        state = C.FailureState.from_episode(ep)
        eng = ScriptedEngine(tok, [call("echo ok > /app/out.txt"), "Fixed."])
        groups, stats = R.run_recoveries([state], {task.name: task}, 2, eng, rcfg)
        C.remove_image(ep.snapshot)
    rows = G.group_rows([G.Group("fork", state.id, state.category, groups[0])], use_std=False)
    batch = C.collate([r.trace for r in rows], tok.pad_token_id)
    last = max(i for i, m in enumerate(state.messages) if m["role"] == "assistant")
    pending = state.messages[last + 1:] + [C.recovery_message(task.instruction)]
    start = len(state.ids) + len(C.delta_ids(tok, state.messages[: last + 1], pending))
    for rec, row, m in zip(groups[0], rows, batch["loss_mask"], strict=True):
        assert rec.reward == 1.0 and row.adv == 0.0
        mask = rec.trace.mask
        assert rec.trace.ids[: len(state.ids)] == state.ids
        # the failed attempt, its late observations and the recovery message: context (0)
        assert not any(mask[:start]) and mask[start] == 1
        assert m[: len(mask)].tolist() == mask and not m[len(mask):].any()
        # exactly the tokens the engine sampled in this attempt, none of the observations
        sampled = [i for i, lp in enumerate(rec.trace.logprobs) if lp != 0.0]
        assert [i for i, v in enumerate(mask) if v] == sampled
    assert sum(sum(r.trace.mask) for r in rows) == stats["gen_tokens"]


def _has_containers() -> bool:
    mine = {"label": [C.LABEL, f"reterm.run={C.RUN_ID}"]}
    return bool(C.docker_client().containers.list(all=True, filters=mine))


@pytest.mark.slow
@pytest.mark.usefixtures("docker_ready")
def test_stage04_step_with_real_forks_checkpoints_resumes_and_cleans_up(make_task, tiny, tmp_path, capsys):
    coin = "mkdir -p /logs/verifier; echo $((RANDOM % 2)) > /logs/verifier/reward.txt\n"
    task = C.load_task(make_task("coin", test=coin))  # a verifier that mixes rewards inside a group
    engine_kind = "vllm" if importlib.util.find_spec("vllm") else "hf"
    # stage 03's part, scripted (stage 04 below samples with the real engine): the coin fails some
    rcfg = C.RolloutConfig(max_turns=2, max_context=2048, concurrency=4,
                           sampling=C.SamplingConfig(max_tokens=16))
    engine = ScriptedEngine(C.load_tokenizer(tiny), [call("echo tried > /app/out.txt"), "Done."])
    with C.env_session():
        states = []
        for _ in range(6):
            eps, _ = R.run_attempts([task] * 3, engine, rcfg, commit="failed")
            states += [C.FailureState.from_episode(e, "tiny") for e in eps if e.snapshot]
            if states:
                break
    assert states and all(s.ids for s in states)
    for s in states:
        C.append_jsonl(tmp_path / "failures.jsonl", dataclasses.asdict(s) | {"extra_key": 1})
    try:
        _run_stage04(tmp_path, tiny, task, states, engine_kind, capsys)
    finally:  # stage 03's own snapshots were re-tagged by the pool, never removed by it
        for s in states:
            C.remove_image(s.snapshot)


def _run_stage04(tmp_path, tiny, task, states, engine_kind, capsys):
    out = tmp_path / "grpo"
    args = ["--failures", str(tmp_path / "failures.jsonl"), "--model", str(tiny), "--out", str(out),
            "--tasks", str(task.path.parent), "--groups-per-step", "2", "--group-size", "4",
            "--fresh-frac", "0.5",
            "--max-tokens", "16", "--max-turns", "2", "--max-context", "2048", "--engine", engine_kind,
            "--dtype", "float32", "--lr", "1e-4", "--concurrency", "8", "--save-every", "1"]
    G.main(args + ["--steps", "1", "--keep-pool"])
    rows = C.read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and (out / "ckpt" / ".metadata").exists()
    r = rows[0]
    assert r["groups"] == 2 and r["recovery"] is not None and r["fresh_pass"] is not None
    assert sorted(g["kind"] for g in r["group_rewards"]) == ["fork", "fresh"]
    assert all(g["task"] == task.name and len(g["rewards"]) == 4 for g in r["group_rewards"])
    assert {"reward", "recovery_by_category", "groups_dropped", "pool", "rollout_s", "train_s",
            "gen_tokens_per_s", "train_tokens_per_s", "env_steps"} <= set(r)
    if r["groups_dropped"] < r["groups"]:
        assert r["train_tokens"] > 0 and {"clip_frac", "approx_kl", "nll"} <= set(r)
    assert not _has_containers()
    G.main(args + ["--steps", "2", "--save-every", "0"])  # 0: a checkpoint at the end only
    assert "resumed after step 1" in capsys.readouterr().out
    assert [r["step"] for r in C.read_jsonl(out / "metrics.jsonl")] == [1, 2]
    assert (out / "final" / "config.json").exists() and C.load_model(out / "final") is not None
    assert C.load_scaffold(out / "final").max_turns == 2  # the scaffold it trained under, for stage 05
    assert not _has_containers()
    client = C.docker_client()
    mine = "reterm-pool/" + hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:12]
    assert not [t for im in client.images.list() for t in im.tags if t.startswith(mine)]  # pool tags gone
    for s in states:
        client.images.get(s.snapshot)  # still there
    # standard mode (an empty pool: its groups start fresh) checkpoints and resumes too
    std = [a if a != str(out) else str(tmp_path / "standard") for a in args[2:]] + ["--mode", "standard"]
    G.main(std + ["--steps", "1"])
    G.main(std + ["--steps", "2"])
    assert "resumed after step 1" in capsys.readouterr().out
    assert [r["step"] for r in C.read_jsonl(tmp_path / "standard/metrics.jsonl")] == [1, 2]


@pytest.mark.usefixtures("docker_ready")
def test_failure_states_that_fill_the_context_are_skipped_at_load(make_task, tmp_path):
    task = C.load_task(make_task("long"))
    tok = C.make_tiny_tokenizer()
    rcfg = C.RolloutConfig(max_context=4096, sampling=C.SamplingConfig(max_tokens=512))
    msgs = C.initial_messages(task.instruction) + [{"role": "assistant", "content": "done"}]
    short = C.FailureState("short", task.name, "reterm-test/absent:x", msgs, [1] * 100, "gave_up_early")
    long = dataclasses.replace(short, id="long", ids=[1] * 3500)  # leaves < 2 turns of 512 tokens
    for st in (short, long):
        C.append_jsonl(tmp_path / "failures.jsonl", dataclasses.asdict(st))
    cfg = C.parse_config(G.Config, ["--model", "m", "--out", str(tmp_path), "--failures",
                                    str(tmp_path / "failures.jsonl")])
    tasks = {task.name: task}
    assert G.fits(short, tasks, tok, rcfg, 0) and not G.fits(long, tasks, tok, rcfg, 0)
    assert G.fits(long, tasks, tok, rcfg, 64)  # --min-recovery-tokens 64
    pool = G.init_pool(cfg, tmp_path, tasks, tok, rcfg)  # the short one's image is absent: skipped too
    assert pool.skipped_long == 1 and "long" not in pool.states


@pytest.mark.slow
@pytest.mark.usefixtures("docker_ready")
def test_standard_retry_goes_on_from_each_failed_attempt_and_trains_the_pair(make_task, tiny, tmp_path):
    """--mode standard_retry: every failed fresh attempt goes on with the recovery turn in a fork of
    its container; a sample's reward is then its recovery's, both attempts are rows with its
    advantage, an attempt that passed has no recovery, and no snapshot outlives the step."""
    fails = C.load_task(make_task("retry"))
    always = "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
    passes = C.load_task(make_task("pass1", test=always))
    tok = C.load_tokenizer(tiny)
    eng = ScriptedEngine(tok, [call("echo wrong > /app/out.txt"), "Done.",
                               call("cat /app/out.txt; echo ok > /app/out.txt"), "Fixed."])
    cfg = C.parse_config(G.Config, ["--model", "m", "--out", str(tmp_path), "--mode", "standard_retry",
                                    "--group-size", "2", "--no-internet"])
    rcfg = C.RolloutConfig(max_turns=5, max_context=8192, concurrency=4)
    client = C.docker_client()
    mine = {"label": [C.LABEL, f"reterm.run={C.RUN_ID}"]}  # this run's: the engine may be shared
    before = {im.id for im in client.images.list(filters=mine)}
    with C.env_session():
        plan = [{"kind": "fresh", "key": "retry"}, {"kind": "fresh", "key": "pass1"}]
        (a, b), stats = G.run_groups(plan, cfg, {"retry": fails, "pass1": passes}, eng, rcfg)
    assert [ep.reward for ep in a.episodes] == [0.0, 0.0] and a.rewards == [1.0, 1.0]
    for ep, retry in a.samples():
        assert ep.snapshot is None and retry.reward == 1.0
        # the recovery's context is the failed attempt itself, and only the recovery's turns train
        assert retry.trace.ids[: len(ep.trace.ids)] == ep.trace.ids
        assert not any(retry.trace.mask[: len(ep.trace.ids)]) and any(retry.trace.mask)
        assert "cat /app/out.txt" in retry.commands[0]["command"]
    assert b.rewards == [1.0, 1.0] and b.retries == [None, None]
    assert stats["env_steps"] == 2 * 4 + 2 * 2  # both attempts of a retried sample count
    metrics = G.step_metrics([a, b], 0, G.FailurePool(0.1))  # first attempts, and the recoveries on their own
    assert (metrics["fresh_pass"], metrics["retry_recovery"], metrics["reward"]) == (0.5, 1.0, 1.0)
    rows = G.group_rows([a, b], True)
    assert [r.trace for r in rows] == [a.episodes[0].trace, a.retries[0].trace, a.episodes[1].trace,
                                       a.retries[1].trace, b.episodes[0].trace, b.episodes[1].trace]
    assert {im.id for im in client.images.list(filters=mine)} <= before


# ── main's loop with the rollouts and the update replaced: budget, resume ──


def _engine() -> types.SimpleNamespace:
    """An engine that sleeps, wakes and takes pushed weights, and samples nothing."""
    return types.SimpleNamespace(sleep=lambda: None, wake_weights=lambda: None, wake_kv=lambda: None,
                                 update_weights=lambda weights: list(weights), close=lambda: None)


def _stub_main(monkeypatch, env_steps) -> None:
    """Stage 04's main as it is (config, loop, checkpoints, resume, pool, metrics) with each step's
    rollouts replaced by env_steps(step, pool) -> environment steps spent: no group, so no update."""
    spent = {}

    def plan_groups(step, cfg, pool, tasks):
        spent["n"] = env_steps(step, pool)
        return []
    monkeypatch.setattr(G, "plan_groups", plan_groups)
    monkeypatch.setattr(G, "run_groups", lambda plan, *a: ([], {"env_steps": spent["n"]}))
    monkeypatch.setattr(C, "make_engine", lambda *a, **k: _engine())


def _steps(out) -> list[tuple[int, int]]:
    return [(r["step"], r["env_steps_total"]) for r in C.read_jsonl(out / "metrics.jsonl")]


def test_the_env_step_budget_stops_at_the_first_step_past_it_and_survives_resume(
        monkeypatch, make_task, tiny, tmp_path, capsys):
    _stub_main(monkeypatch, lambda step, pool: 7)
    out = tmp_path / "run"
    args = ["--model", str(tiny), "--out", str(out), "--tasks", str(make_task().parent), "--mode", "standard",
            "--engine", "hf", "--steps", "10", "--save-every", "0"]
    G.main(args + ["--env-step-budget", "21"])  # 7, 14, 21: step 3 reaches it
    assert _steps(out) == [(1, 7), (2, 14), (3, 21)]
    assert "environment-step budget 21 spent after step 3" in capsys.readouterr().out
    G.main(args + ["--env-step-budget", "21"])  # resumed with the budget spent: no step runs
    assert "resumed after step 3" in capsys.readouterr().out and len(_steps(out)) == 3
    G.main(args + ["--env-step-budget", "30"])  # the checkpoint's 21 count towards a larger budget
    assert _steps(out) == [(1, 7), (2, 14), (3, 21), (4, 28), (5, 35)]
    assert "environment-step budget 30 spent after step 5" in capsys.readouterr().out


def test_tensorboard_gets_every_steps_metrics_jsonl_scalars(monkeypatch, make_task, tiny, tmp_path):
    """--tensorboard DIR: each step's numeric metrics.jsonl fields reach the writer (rank 0's, made
    once) as scalars at that step, under the same names; a stand-in writer: the package is optional."""
    scalars, dirs = [], []
    writer = types.SimpleNamespace(add_scalar=lambda *a: scalars.append(a), flush=lambda: None)
    monkeypatch.setattr(C, "check_tensorboard", lambda logdir: None)
    monkeypatch.setattr(C, "tensorboard_writer", lambda logdir: dirs.append(logdir) or writer)
    _stub_main(monkeypatch, lambda step, pool: 5)
    out = tmp_path / "run"
    G.main(["--model", str(tiny), "--out", str(out), "--tasks", str(make_task().parent), "--mode", "standard",
            "--engine", "hf", "--steps", "2", "--save-every", "0", "--tensorboard", str(tmp_path / "tb")])
    rows = C.read_jsonl(out / "metrics.jsonl")
    assert dirs == [str(tmp_path / "tb")] and [r["step"] for r in rows] == [1, 2]
    assert scalars == [(k, r[k], r["step"]) for r in rows for k in C.metric_fields([r])]
    assert {"reward", "env_steps_total", "gen_tokens_per_s", "train_tokens_per_s", "mem_gb_push", "pool"} <= {
        k for k, _, _ in scalars}


@pytest.mark.usefixtures("docker_ready")
def test_fork_resume_restores_the_checkpoints_pool_removes_orphans_and_records_each_step_once(
        monkeypatch, make_task, tiny, tmp_path):
    """A run checkpoints after step 2, adds a state at step 3 and dies in step 4. Its resume starts
    step 3 from the checkpoint's pool (states, history, skipped count), the state of the lost step 3
    is gone with its image, and metrics.jsonl holds each step once."""
    client, repo = C.docker_client(), "reterm-test-resume/" + tmp_path.name.lower()[-20:]
    task = make_task()
    seen, tags, crash = {}, {}, [True]

    class Crash(Exception):
        pass

    def step(n, pool):
        key = (crash[0], n)  # which run, which step
        seen[key] = copy.deepcopy(pool.to_dict())  # the pool as the step starts
        tags[key] = sorted(t for t in client.images.get(C.BASE_IMAGE).tags if t.startswith(repo))
        if crash[0] and n == 4:
            raise Crash
        client.images.get(C.BASE_IMAGE).tag(repo, f"s{n}")
        state = C.FailureState(f"s{n}", task.name, f"{repo}:s{n}", [], [1], "gave_up_early")
        pool.add(state, f"{repo}:s{n}", n)
        pool.hist[state.id] = [0.5]
        pool.hist[task.name] = pool.hist.get(task.name, []) + [n / 10]
        pool.skipped_long += 1
        return 1

    _stub_main(monkeypatch, step)
    out = tmp_path / "run"
    args = ["--model", str(tiny), "--out", str(out), "--tasks", str(task.parent), "--mode", "fork",
            "--fresh-frac", "1", "--engine", "hf", "--steps", "4", "--save-every", "2"]
    try:
        with pytest.raises(Crash):
            G.main(args)
        assert [r["step"] for r in C.read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
        assert f"{repo}:s3" in (out / "pool_live.json").read_text()
        crash[0] = False
        G.main(args)
        ckpt = seen[True, 3]  # what the step-2 checkpoint holds
        assert sorted(ckpt["states"]) == ["s1", "s2"] and ckpt["skipped_long"] == 2
        assert ckpt["hist"] == {"s1": [0.5], "s2": [0.5], task.name: [0.1, 0.2]}
        assert seen[False, 3] == ckpt  # the resumed run starts from it, not from stage 03's file
        assert tags[False, 3] == [f"{repo}:s1", f"{repo}:s2"]  # the lost step's image is gone
        assert [r["step"] for r in C.read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4]
        assert not [t for t in client.images.get(C.BASE_IMAGE).tags if t.startswith(repo)]  # run over
    finally:
        for t in client.images.get(C.BASE_IMAGE).tags:
            if t.startswith(repo):
                C.remove_image(t)


# ── main's loop with the rollouts replaced and the update real: --kl-beta, final/ ──


def _fixed_rows_main(monkeypatch, tok) -> list:
    """Stage 04's main with every step's rollouts replaced by the same four rows (advantages ±1,
    three sampled tokens each) and an engine that takes the pushed weights; the update is real."""
    prompt = tok.encode("<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n")
    rows = []
    for i, adv in enumerate([1.0, -1.0, 1.0, -1.0]):
        trace = C.TokenTrace()
        trace.add_context(prompt)
        trace.add_sampled([100 + i, 200 + i, 300 + i], [-1.0] * 3, trained=True)
        rows.append(G.Row(trace, adv))
    monkeypatch.setattr(G, "run_groups", lambda plan, *a: ([], {"env_steps": 4}))
    monkeypatch.setattr(G, "group_rows", lambda *a: rows)
    monkeypatch.setattr(C, "make_engine", lambda *a, **k: _engine())
    return rows


def _ref_kl_by_hand(policy, ref, rows) -> float:
    """Mean over the trained tokens of k3 = exp(ref - logp) - (ref - logp) - 1, from the two models'
    logits (temperature 1), one row at a time."""
    total, n = 0.0, 0
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r.trace.ids])
            lp, lr = (m(ids).logits[0, :-1].float().log_softmax(-1) for m in (policy, ref))
            pos = [t - 1 for t, m in enumerate(r.trace.mask) if m]
            nxt = ids[0, 1:]
            d = torch.stack([lr[p, nxt[p]] - lp[p, nxt[p]] for p in pos])
            total, n = total + (d.exp() - d - 1).sum().item(), n + len(pos)
    return total / n


@pytest.mark.slow
def test_kl_beta_uses_the_start_model_as_reference_and_final_is_the_last_checkpoint(
        monkeypatch, make_task, tiny, tmp_path):
    """--kl-beta 0.5 on fixed rows whose advantages cancel (no IS weight): the loss is 0.5 · ref_kl. Step 1's
    policy is the reference (KL 0); step 2 (resumed from step 1's checkpoint) logs the KL of step 1's
    weights to the start model, by hand. final/ holds the last checkpoint's weights, not the start's.
    Without --kl-beta no reference is loaded and no ref_kl is logged."""
    tok, start = C.load_tokenizer(tiny), C.load_model(tiny)
    rows = _fixed_rows_main(monkeypatch, tok)
    out = tmp_path / "run"
    args = ["--model", str(tiny), "--out", str(out), "--tasks", str(make_task().parent), "--mode", "standard",
            "--engine", "hf", "--lr", "1e-2", "--temperature", "1.0", "--is-cap", "0", "--save-every", "1"]
    G.main(args + ["--kl-beta", "0.5", "--steps", "1"])
    after1 = C.load_model(out / "final")
    G.main(args + ["--kl-beta", "0.5", "--steps", "2"])
    m1, m2 = C.read_jsonl(out / "metrics.jsonl")
    assert m1["ref_kl"] == pytest.approx(0.0, abs=1e-7) and m1["loss"] == pytest.approx(0.0, abs=1e-6)
    assert m2["ref_kl"] > 1e-4, m2
    assert m2["ref_kl"] == pytest.approx(_ref_kl_by_hand(after1, start, rows), rel=1e-3)
    assert m2["loss"] == pytest.approx(0.5 * m2["ref_kl"], rel=1e-3)
    final, ckpt = C.load_model(out / "final"), C.load_model(tiny)
    C.load_checkpoint(out / "ckpt", ckpt, torch.optim.AdamW(ckpt.parameters()))
    fsd, csd, ssd = final.state_dict(), ckpt.state_dict(), start.state_dict()
    assert fsd.keys() == csd.keys() and all(torch.equal(fsd[k], csd[k]) for k in fsd)
    assert any(not torch.equal(fsd[k], ssd[k]) for k in fsd)
    assert not all(torch.equal(fsd[k], after1.state_dict()[k]) for k in fsd)  # step 2 moved it on

    loaded = []
    monkeypatch.setattr(C, "load_model_sharded", lambda *a, **k: loaded.append(a) or C.load_model(tiny))
    G.main(args + ["--out", str(tmp_path / "nokl"), "--steps", "1"])
    assert len(loaded) == 1 and "ref_kl" not in C.read_jsonl(tmp_path / "nokl" / "metrics.jsonl")[0]


# ── --verify-fresh through 04's rollouts ──

LOOP = "nohup sh -c 'while :; do echo ok > /app/out.txt; sleep 0.05; done' >/dev/null 2>&1 &"
RESET_THEN_READ = """\
mkdir -p /logs/verifier
echo bad > /app/out.txt; sleep 1
r=0; [ "$(cat /app/out.txt)" = ok ] && r=1
echo $r > /logs/verifier/reward.txt
"""


@pytest.mark.slow
@pytest.mark.usefixtures("docker_ready")
def test_verify_fresh_verifies_04s_rollouts_where_no_agent_process_is_left(make_task, tiny):
    """The agent leaves a loop that writes the answer; the verifier resets it and reads it a second
    later. Verified in the attempt's own container (--no-verify-fresh) the loop forges a pass; with
    --verify-fresh, the default, in a fresh fork of it, the loop is gone and the attempt fails."""
    task = C.load_task(make_task("forge", test=RESET_THEN_READ))
    tok = C.load_tokenizer(tiny)
    rewards = {}
    with C.env_session():
        for flag in (["--no-verify-fresh"], []):
            cfg = C.parse_config(G.Config, ["--model", str(tiny), "--out", "o", "--mode", "standard",
                                            "--groups-per-step", "1", "--group-size", "1", "--max-turns", "2",
                                            *flag])
            _, rcfg = G.rollout_settings(cfg)
            engine = ScriptedEngine(tok, [call(LOOP), "Done."])
            plan = G.plan_groups(1, cfg, G.FailurePool(cfg.floor), {task.name: task})
            groups, _ = G.run_groups(plan, cfg, {task.name: task}, engine, rcfg)
            (ep,) = groups[0].episodes
            assert ep.error is None and G.drop_env_failures(groups) == 0, ep.error
            rewards[cfg.verify_fresh] = ep.reward
    assert rewards == {False: 1.0, True: 0.0}
