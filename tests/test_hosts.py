"""Two real Docker engines on one machine: a 05 oracle run and a 04 fork-mode step spread over
both give the rewards of a one-engine run, every fork starts where its snapshot is (or after a
counted copy), nothing is left on either engine, and losing an engine mid-step ends only its
episodes and its failure states."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import threading
import time
import types

import batch_rollouts as R
import pytest
from conftest import ScriptedEngine, call

import common as C

E = importlib.import_module("05_eval_tb2")
G = importlib.import_module("04_reterm_grpo")


@pytest.fixture(autouse=True)
def one_engine_after():
    yield
    C.use_docker_hosts("")


# ── placement rules: fake engines on a fake clock, no Docker ─────────────────


class Clock:
    def __init__(self):
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    """common's clock (slot() times each hold with it), advanced by hand."""
    c = Clock()
    monkeypatch.setattr(C, "time", types.SimpleNamespace(monotonic=c.monotonic))
    return c


def _waiting(fn) -> tuple[threading.Thread, list]:
    """Run fn on a thread; (the thread, its result box) after 0.3 s, the thread still waiting or done."""
    box: list = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(0.3)
    return t, box


def test_fresh_starts_take_the_least_loaded_engine_and_wait_when_every_slot_is_busy():
    hosts = C.Hosts("unix:///a#2,unix:///b#4")
    a, b = hosts.hosts
    got = [hosts.acquire() for _ in range(6)]
    assert got == [a, b, b, a, b, b]  # the lowest busy / slots; a tie goes to the engine listed first
    assert (a.busy, b.busy) == (2, 4)
    t, box = _waiting(hosts.acquire)
    assert t.is_alive() and not box  # all 6 slots busy: it waits...
    hosts.release(a, held_s=1.0)
    t.join(5)
    assert box == [a] and (a.busy, b.busy) == (2, 4)  # ...for the slot that came free


def test_busy_never_exceeds_slots_under_concurrent_episodes():
    hosts = C.Hosts("unix:///a#2,unix:///b#3")
    seen, lock = [], threading.Lock()

    def episodes():
        for _ in range(40):
            with hosts.slot():
                with lock:
                    seen.append(tuple(h.busy for h in hosts.hosts))
                time.sleep(0.005)  # an episode: the workers overlap
    threads = [threading.Thread(target=episodes) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(seen) == 8 * 40 and all(x <= 2 and y <= 3 for x, y in seen), max(seen)
    assert max(x + y for x, y in seen) == 5  # 8 workers for 5 slots: every slot was used
    assert [h.busy for h in hosts.hosts] == [0, 0]


def test_a_fork_waits_for_its_snapshots_engine_unless_a_copy_is_expected_to_be_faster(clock, monkeypatch):
    """auto: copy when size / copy rate (no copy yet: 100 MB/s) < the home's mean hold / its slots."""
    copies = []

    def fake_copy(self, image, src, dst):
        copies.append((image, src, dst))
        self.where[image].add(dst)
    monkeypatch.setattr(C.Hosts, "_copy", fake_copy)
    hosts = C.Hosts("unix:///a#1,unix:///b#2")
    a, b = hosts.hosts
    hosts.note("snap", a.url)
    hosts.sizes["snap"] = 10**9  # a 10 s copy at the assumed rate
    for _ in range(2):  # forks hold a's one slot 4 s each: waiting (~4 s) beats copying
        with hosts.slot("snap") as url:
            assert url == a.url
            clock.t += 4.0
    first = hosts.acquire("snap")
    t, box = _waiting(lambda: hosts.acquire("snap"))
    assert first is a and t.is_alive() and not copies  # auto declines to copy: the fork waits
    hosts.release(first, held_s=4.0)
    t.join(5)
    assert box == [a] and not copies
    hosts.release(a, held_s=4.0)
    with hosts.slot("snap"):  # one fork holds a for 100 s: the mean hold is now 116 / 5 s > 10 s
        clock.t += 100.0
    first = hosts.acquire("snap")
    assert hosts.acquire("snap") is b and copies == [("snap", a.url, b.url)]  # now the copy pays
    assert hosts.counts["forks_moved"] == 1 and set(hosts.homes("snap")) == {a.url, b.url}
    assert hosts.acquire("snap") is b and len(copies) == 1  # b holds a copy: no second one
    never = C.Hosts("unix:///a#1,unix:///b#2", move="never")
    never.note("snap", "unix:///a")
    never.acquire("snap")
    t, box = _waiting(lambda: never.acquire("snap"))
    assert t.is_alive() and len(copies) == 1  # never: it waits, however slow a's forks are
    never.release(never.hosts[0])
    t.join(5)
    assert box == [never.hosts[0]]


def test_ranks_split_each_engines_slots_and_together_use_them_all():
    for slots in range(1, 10):
        for world in range(1, 5):
            share = [G.rank_slots(slots, r, world) for r in range(world)]
            assert min(share) >= 1 and max(share) - min(share) <= 1, (slots, world, share)
            assert sum(share) == max(slots, world), (slots, world, share)


# ── two real engines ─────────────────────────────────────────────────────────


def leftovers(url: str | None) -> tuple[list, list]:
    """Containers and snapshot images of this test run on one engine."""
    client = C.docker_client(url)
    mine = [C.LABEL, f"reterm.run={C.RUN_ID}"]
    return (client.api.containers(all=True, filters={"label": mine}),
            client.api.images(filters={"label": ["reterm.kind=snapshot", f"reterm.run={C.RUN_ID}"]}))


def make_tasks(make_task, names: list[str]) -> dict[str, C.Task]:
    """Tasks whose tests pass iff /app/out.txt says ok; "stuck" ones also want a file nobody writes."""
    tasks = {}
    for n in names:
        test = ("mkdir -p /logs/verifier; r=0; [ \"$(cat /app/out.txt 2>/dev/null)\" = ok ] && "
                + ("[ -f /app/never ] && " if n.startswith("stuck") else "") + "r=1\n"
                "echo $r > /logs/verifier/reward.txt\n")
        tasks[n] = C.load_task(make_task(n, test=test))  # conftest's task.toml: no network
    return tasks


@pytest.mark.slow
def test_oracle_eval_over_two_engines_equals_one_engine(make_task, second_engine, tmp_path):
    make_tasks(make_task, ["a1", "a2", "a3", "stuck1"])
    root = str(tmp_path / "tasks")
    one = E.main(["--tasks", root, "--out", str(tmp_path / "one"), "--concurrency", "4"])
    two = E.main(["--tasks", root, "--out", str(tmp_path / "two"), "--concurrency", "4",
                  "--docker-hosts", f"{C._default_url()}#2,{second_engine.url}#2"])
    rows = {d: {r["task"]: r for r in C.read_jsonl(tmp_path / d / "trials.jsonl")} for d in ("one", "two")}
    rewards = [{t: r["reward"] for t, r in rows[d].items()} for d in ("one", "two")]
    assert rewards[0] == rewards[1]
    assert one["pass_at_1"] == two["pass_at_1"] == 0.75
    assert {r["host"] for r in rows["one"].values()} == {None}
    assert {r["host"] for r in rows["two"].values()} == {None, second_engine.url}  # spread over both
    for url in (None, second_engine.url):
        assert leftovers(url) == ([], [])


def _grpo_step(tasks, failures, out, hosts: str, move: str = "auto", engine=None):
    """Stage 04's rollout half of one fork-mode step (B=2 states x G=3 forks) on `hosts`."""
    C.use_docker_hosts(hosts, move)
    cfg = C.parse_config(G.Config, ["--model", "scripted", "--out", str(out), "--failures", str(failures),
                                    "--groups-per-step", "2", "--group-size", "3", "--fresh-frac", "0",
                                    "--concurrency", "8"])
    rcfg = C.RolloutConfig(max_turns=3, max_context=8192, concurrency=8,
                           sampling=C.SamplingConfig(max_tokens=64, seed=0))
    tok = C.make_tiny_tokenizer()
    pool = G.init_pool(cfg, out, tasks, tok, rcfg)
    engine = engine or ScriptedEngine(tok, [call("echo ok > /app/out.txt"), "Fixed."])
    return pool, *_rollout_half(cfg, pool, tasks, engine, rcfg, tok)


def _rollout_half(cfg, pool, tasks, engine, rcfg, tok) -> tuple[list, dict]:
    """Step 1 and the pool update of main's loop, on one process: the groups (environment failures
    dropped) and the step's stats."""
    plan = G.plan_groups(1, cfg, pool, tasks)
    groups, stats = G.hand_off(plan, lambda share: G.run_groups(share, cfg, tasks, engine, rcfg), 0, 1)
    stats["env_errors"] = G.drop_env_failures(groups)
    return groups, stats | G.update_pool(pool, groups, 1, cfg, lambda s: G.fits(s, tasks, tok, rcfg, 0))


def _failure_states(tasks, path, hosts: str) -> list[C.FailureState]:
    """Failed first attempts (a snapshot each) of every task, placed by `hosts`."""
    C.use_docker_hosts(hosts)
    tok = C.make_tiny_tokenizer()
    rcfg = C.RolloutConfig(max_turns=3, max_context=8192, concurrency=8)
    eps, _ = R.run_attempts(list(tasks.values()), ScriptedEngine(tok, [call("echo no > /app/out.txt")]),
                            rcfg, commit="failed")
    states = [C.FailureState.from_episode(ep, "scripted") for ep in eps]
    assert all(s.snapshot for s in states)
    for s in states:
        C.append_jsonl(path, dataclasses.asdict(s))
    return states


@pytest.mark.slow
def test_grpo_fork_step_over_two_engines_forks_where_the_snapshot_is(make_task, second_engine, tmp_path):
    tasks = make_tasks(make_task, ["fix", "stuck"])
    d2 = second_engine.url
    with C.env_session():
        # one engine: states and forks on the default engine
        base = _failure_states(tasks, tmp_path / "f1.jsonl", "")
        pool1, groups1, _ = _grpo_step(tasks, tmp_path / "f1.jsonl", tmp_path / "g1", "")
        for s in list(pool1.states.values()) + [{"state": dataclasses.asdict(s)} for s in base]:
            C.remove_image(s["state"]["snapshot"])
        # two engines: every state on the second one (2 slots), so its 6 forks want 2 more slots
        states = _failure_states(tasks, tmp_path / "f2.jsonl", f"{d2}#2")
        assert {s.host for s in states} == {d2} and {s.id for s in states} == {s.id for s in base}
        pool2, groups2, stats = _grpo_step(tasks, tmp_path / "f2.jsonl", tmp_path / "g2",
                                           f"{C._default_url()}#2,{d2}#2")
        hosts = C.HOSTS
        forks = [(pool2.states[g.key]["state"]["snapshot"], ep) for g in groups2 for ep in g.episodes]
        assert len(forks) == 6 and stats["env_errors"] == 0
        for image, ep in forks:  # each fork ran on an engine that held its snapshot
            assert ep.host in hosts.where[image]
            C.docker_client(ep.host).images.get(image)
        moved = [ep for image, ep in forks if ep.host != d2]
        assert moved and hosts.counts["moves"] >= 1 and stats["moves"] == hosts.counts["moves"]
        assert hosts.counts["forks_home"] + hosts.counts["forks_moved"] == 6
        assert hosts.counts["move_bytes"] > 0
        for s in pool2.states.values():  # the pool's tags: every copy
            C.remove_image(s["state"]["snapshot"])
        for s in states:  # stage 03's snapshots, made under another Hosts: say where
            C.remove_image(s.snapshot, s.host)
    rewards = [{g.key: g.rewards for g in gs} for gs in (groups1, groups2)]
    assert rewards[0] == rewards[1]
    assert sorted(map(tuple, rewards[1].values())) == [(0.0,) * 3, (1.0,) * 3]
    ours = [s.snapshot for s in base + states] + [  # the default engine is shared: only ours count
        "reterm-pool/" + hashlib.sha256(str((tmp_path / g).resolve()).encode()).hexdigest()[:12]
        for g in ("g1", "g2")]
    for url in (None, d2):  # no container, snapshot or pool tag left on either engine
        assert leftovers(url) == ([], [])
        # the low-level list: the high-level one re-fetches each image, and other runs remove theirs
        tags = [t for im in C.docker_client(url).api.images() for t in im.get("RepoTags") or []]
        mine = tuple(ours) if url is None else ("reterm-snap/", "reterm-pool/")  # the second is all ours
        assert not [t for t in tags if t.startswith(mine)]


class StopsAnEngine(ScriptedEngine):
    """Scripted recoveries; the engine `victim` is shut down while the first turns are being served."""

    def __init__(self, tok, victim):
        super().__init__(tok, [call("sleep 1; echo ok > /app/out.txt"), "Fixed."])
        self.victim, self.calls = victim, 0

    def generate(self, prompts, sampling, seeds=None):
        self.calls += 1
        if self.calls == 2:
            self.victim.stop()
        return super().generate(prompts, sampling, seeds)


@pytest.mark.slow
def test_losing_an_engine_mid_step_ends_its_episodes_and_states_only(make_task, second_engine, tmp_path):
    tasks = make_tasks(make_task, ["fix1", "fix2", "fix3", "fix4"])
    d2 = second_engine.url
    hosts = f"{C._default_url()}#2,{d2}#2"
    try:
        with C.env_session():
            states = _failure_states(tasks, tmp_path / "f.jsonl", hosts)
            assert sorted(s.host or "" for s in states) == sorted(["", "", d2, d2])
            cfg_args = G.Config(model="s", out=str(tmp_path / "g"), failures=str(tmp_path / "f.jsonl"),
                                groups_per_step=4, group_size=2, fresh_frac=0.0, concurrency=8)
            C.use_docker_hosts(hosts, "never")
            rcfg = C.RolloutConfig(max_turns=3, max_context=8192, concurrency=8,
                                   sampling=C.SamplingConfig(max_tokens=64, seed=0))
            pool = G.init_pool(cfg_args, tmp_path / "g", tasks, C.make_tiny_tokenizer(), rcfg)
            engine = StopsAnEngine(C.make_tiny_tokenizer(), second_engine)
            groups, stats = _rollout_half(cfg_args, pool, tasks, engine, rcfg, C.make_tiny_tokenizer())
            by_host = {s.id: s.host for s in states}
            assert C.HOSTS.counts["hosts_lost"] == 1 and C.HOSTS.live() == [None]
            assert stats["states_lost"] == 2 and {by_host[k] for k in pool.states} == {None}
            assert stats["env_errors"] == 4  # the 2 x 2 forks of the lost engine's states
            for g in groups:  # the other engine's groups ran to the end
                assert g.rewards == ([1.0, 1.0] if by_host[g.key] is None else [])
            for s in pool.states.values():
                C.remove_image(s["state"]["snapshot"])
            for s in (s for s in states if s.host is None):  # the lost engine's are gone with it
                C.remove_image(s.snapshot)
        assert leftovers(None) == ([], [])
    finally:  # bring the engine back for later tests and clear what its shutdown left behind
        second_engine.start()
        C.reap(None, kept=True, host=d2)
        C.docker_client(d2).images.prune(filters={"dangling": True})
