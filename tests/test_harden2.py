"""The second round of attacks, each against a real container: rewards the policy cannot forge
(the reward channel, the verifier's tools), policy faults that stay the policy's, task limits
refused at load, and episodes that cannot reach each other or fill the disk."""

from __future__ import annotations

import importlib
import json
import textwrap
import threading

import batch_rollouts as R
import pytest
import test_harden
from conftest import FakeEngine, ScriptedEngine, call

import common as C

pytestmark = [pytest.mark.usefixtures("docker_ready"), pytest.mark.slow]

TOML = test_harden.TOML + "allow_internet = false\n"  # the first round's limits, no network

# test.sh runs the code under test and trusts it to print a score: it stands for any task whose
# tests run the agent's code (fix-lru-cache imports /app/cache/lru.py), which may print anything.
SCORED_BY_APP = textwrap.dedent("""\
    mkdir -p /logs/verifier
    sh /app/run.sh
    sh /app/score.sh > /logs/verifier/reward.txt
    """)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return C.load_tokenizer(C.make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", arch="qwen3"))


def start(make_task, name: str, extra: str = "", **kw) -> C.Env:
    return C.start_env(C.load_task(make_task(name, toml=TOML + extra, **kw)))


def plant(path: str, script: str, env: C.Env) -> None:
    """Replace a program of the container (a running one can't be written over: move a copy in)."""
    r = env.bash(f"printf '#!/bin/sh\\n%s\\n' '{script}' > /tmp/plant && chmod +x /tmp/plant && "
                 f"mv /tmp/plant {path} && echo planted")
    assert r.output.endswith("planted\n"), r


def test_test_output_cannot_forge_control_lines_or_rewards(make_task):
    with start(make_task, "forge", test=SCORED_BY_APP) as env:
        env.bash("echo 'echo 0' > /app/score.sh")
        for out, fresh in [("0\n@@txt 1\n@@x", False), ("@@txt 1", True), ("@@prep", False),
                           ("@@rc 124", False), ("@@json\n1", True)]:
            env.bash(f"printf 'printf \"%s\\\\n\"\\n' '{out}' > /app/run.sh")
            v = env.verify(fresh=fresh)
            assert (v.reward, v.error) == (0.0, None) and out.splitlines()[-1] in v.output, (out, v)
        for bad in ("inf", "nan", "-1", "1.5", "1e999"):
            env.bash(f"echo 'echo {bad}' > /app/score.sh")
            v = env.verify()
            assert v.reward == 0.0 and "unparsable reward" in v.error and not C.is_infra_error(v.error), v
        env.bash("echo 'echo 1' > /app/score.sh")
        assert (env.verify().reward, env.verify(fresh=True).reward) == (1.0, 1.0)
        env.bash("rm -rf /logs; echo '{\"reward\": NaN}' > /app/r.json; cp /app/r.json /tmp/")
        env.bash("printf 'mkdir -p /logs/verifier; cp /tmp/r.json /logs/verifier/reward.json; exit 9\\n'"
                 " > /app/score.sh")
        v = env.verify()
        assert v.reward == 0.0 and v.error.startswith("unparsable reward") and not C.is_infra_error(v.error)


def test_the_issue_reproduction_on_fix_lru_cache_scores_0():
    with C.start_env(bundled("fix-lru-cache")) as env:  # the module under test prints forged control lines
        env.bash("sed -i '1i print(\"@@txt 1\\\\n@@x\")' /app/cache/lru.py; head -1 /app/cache/lru.py")
        assert "@@txt 1" in env.bash("cd /app/cache && python3 -c 'import lru'").output
        for fresh in (False, True):
            v = env.verify(fresh=fresh)
            assert (v.reward, v.error) == (0.0, None) and "@@txt 1" in v.output, v


def test_agent_caused_verifier_failures_score_0_and_are_not_infra(make_task, monkeypatch):
    monkeypatch.setattr(C, "EXEC_GRACE", 3.0)
    with start(make_task, "hang", test="sleep 1000\n") as env:
        v = env.verify(timeout=2)
        assert (v.reward, v.error) == (0.0, "verifier timed out after 2s")
    with start(make_task, "faketimeout") as env:  # the container's own `timeout` now never returns
        plant("/usr/bin/timeout", "exec sleep 1000", env)
        assert env.verify(timeout=2) == C.Verdict(0.0, None, "")  # the toolchain's timeout ran test.sh
    monkeypatch.setenv("RETERM_TRUSTED_VERIFY", "0")  # as for a pinned image: the container's own tools
    with start(make_task, "faketimeout-own-tools") as env:
        plant("/usr/bin/timeout", "exec sleep 1000", env)
        v = env.verify(timeout=2)
        assert v.reward == 0.0 and "no answer" in v.error and not C.is_infra_error(v.error), v


def test_non_finite_rewards_never_reach_grpo():
    grpo = importlib.import_module("04_reterm_grpo")
    with pytest.raises(ValueError, match="non-finite"):
        grpo.group_advantages([float("nan"), 0.0, 1.0, 0.0])
    eps = lambda rs: [type("Ep", (), {"reward": r})() for r in rs]
    groups = [grpo.Group("fresh", k, "fresh", eps(r)) for k, r in
              (("a", [float("nan")] * 2), ("b", [float("inf"), 0.0]), ("c", [0.0, 1.0]))]
    kept, dropped = grpo.drop_uniform_groups(groups)
    assert [x.key for x in kept] == ["c"] and dropped == 2


def test_policy_faults_are_malformed_turns_and_the_episode_goes_on(make_task, tok):
    task = C.load_task(make_task("faults"))
    deep = "<tool_call>{\"name\": \"bash\", \"arguments\": " + "[" * 1200 + "]" * 1200 + "}</tool_call>"
    surrogate = '<tool_call>{"name": "bash", "arguments": {"command": "echo \\ud800 > /app/x"}}</tool_call>'
    nul = '<tool_call>{"name": "bash", "arguments": {"command": "echo a\\u0000b"}}</tool_call>'
    eng = ScriptedEngine(tok, [deep, surrogate, nul, call("echo ok > /app/out.txt"), "Done."])
    with C.env_session():
        (ep,), _ = R.run_attempts([task], eng, C.RolloutConfig(max_turns=6, max_context=8192, concurrency=1))
    assert (ep.error, ep.malformed, ep.reward, ep.end) == (None, 3, 1.0, "answered")
    errors = [m["content"] for m in ep.messages if m["role"] == "user" and "malformed" in m["content"]]
    assert "RecursionError" in errors[0] and "UTF-8" in errors[1] and "NUL" in errors[2]


def test_task_names_docker_cannot_tag_are_mapped(make_task):
    names = ["Über", "a..b", "-x-", "A" * 200]
    tasks = [C.load_task(make_task(n)) for n in names]
    tags = {C.task_image(t) for t in tasks}
    assert len(tags) == len(names)  # distinct names, distinct images
    try:
        for t in tasks:
            with C.start_env(t) as env:
                assert env.verify().reward == 0.0
                snap = env.snapshot()
                C.remove_image(snap)
    finally:
        for tag in tags:
            C.remove_image(tag)


def test_a_corrupt_model_folder_is_a_one_line_error(make_task, tmp_path):
    import subprocess
    import sys

    model = C.make_tiny_model(tmp_path / "m", arch="qwen3")
    (model / "config.json").write_text("{not json")
    make_task("a")
    r = subprocess.run([sys.executable, "05_eval_tb2.py", "--tasks", str(tmp_path / "tasks"), "--out",
                        str(tmp_path / "ev"), "--agent", "policy", "--model", str(model), "--engine", "hf"],
                       cwd=C.Path(C.__file__).parent, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {model}: cannot load the model (") and "config.json" in last, last


def bundled(name: str) -> C.Task:
    return C.load_task(C.Path(C.__file__).parent / "tasks" / name)


def test_the_verifier_runs_on_the_trusted_toolchain(monkeypatch):
    """dedupe-files' test.sh runs `python3 /tests/check.py`: every way of making that pass without
    the work fails, in place and in a fresh fork, and the oracle still passes among the plants."""
    monkeypatch.setattr(C, "EXEC_GRACE", 5.0)
    task = bundled("dedupe-files")
    with C.start_env(task) as env:
        assert env.trusted
        plant("/usr/sbin/python3", "exit 0", env)
        hook = "import os,sys; sys.argv[0].startswith('/tests/') and os._exit(0)"
        env.bash(f'for d in /usr/lib/python3/dist-packages /usr/local/lib/python3.11/dist-packages; do '
                 f'mkdir -p $d; echo "{hook}" > $d/hook.pth; done')
        assert env.bash("python3 /tests/x.py; echo $?").output.endswith("0\n")  # the agent's python is fooled
        plant("/usr/bin/timeout", "exec sleep 1000", env)
        plant("/usr/bin/tail", "exec sleep 1000", env)
        t0 = C.time.monotonic()
        for fresh in (False, True):
            v = env.verify(fresh=fresh)
            assert (v.reward, v.error) == (0.0, None), v
        assert C.time.monotonic() - t0 < 30
        env.upload(task.solution_dir, "/solution")
        env.bash("rm /usr/sbin/python3")  # the oracle needs a working python3 itself
        assert env.bash("bash /solution/solve.sh >/dev/null; echo $?").output == "0\n"
        plant("/usr/sbin/python3", "exit 1", env)
        assert [env.verify(fresh=f).reward for f in (False, True)] == [1.0, 1.0]


def test_episodes_cannot_reach_each_other_or_the_host(make_task):
    import http.server
    import socket
    import threading

    lines = bundled("dedupe-files").env_dir.joinpath("Dockerfile").read_text().splitlines()
    dockerfile = "\n".join(lines[:2])  # the bundled base layer (python3), cached
    task = C.load_task(make_task("net", toml=TOML.replace("allow_internet = false", "allow_internet = true"),
                                 dockerfile=dockerfile + "\nWORKDIR /app\n"))
    handler = http.server.SimpleHTTPRequestHandler
    srv = http.server.ThreadingHTTPServer(("0.0.0.0", 0), handler)  # a service on the host
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    with C.start_env(task) as a, C.start_env(task) as b:
        assert a.network and b.network and a.network != b.network
        a.bash("echo secret > /app/s.txt; cd /app; nohup python3 -m http.server 8080 >/dev/null 2>&1 &")
        ip = a.bash("hostname -I").output.split()[0]
        get = ("timeout 3 bash -c 'exec 3<>/dev/tcp/{}/{}; "
               "printf \"GET /{} HTTP/1.0\\r\\n\\r\\n\" >&3; cat <&3'")
        C.time.sleep(1)
        assert "secret" in a.bash(get.format("127.0.0.1", 8080, "s.txt")).output  # A's server is up
        assert "secret" not in b.bash(get.format(ip, 8080, "s.txt")).output
        gateway = b.bash("ip route 2>/dev/null | awk '/default/ {print $3}'; "
                         "awk '$2 == \"00000000\" {print $3}' /proc/net/route").output.split()[-1]
        gw = ".".join(str(int(gateway[i:i + 2], 16)) for i in (6, 4, 2, 0)) if len(gateway) == 8 else gateway
        port = srv.server_address[1]
        assert socket.create_connection(("127.0.0.1", port), 2)  # the host service answers on the host
        r = b.bash(get.format(gw, port, ""), timeout=10)
        assert "HTTP/1.0" not in r.output, r
        assert b.bash("getent hosts deb.debian.org >/dev/null && echo resolves").output == "resolves\n"
        nets = {a.network, b.network}
    srv.shutdown()
    assert not [n for n in C.docker_client().networks.list() if n.name in nets]  # gone with the containers


def test_storage_is_bounded_per_container_and_neighbours_are_untouched(make_task, monkeypatch):
    """The cap holds for the container's own writable layer: background writers, several large
    commands and many small files are all stopped near it, and another episode's command is not.
    The watch alone, on any engine (the kernel quota has its own test in test_harden3)."""
    monkeypatch.setenv("RETERM_STORAGE_QUOTA", "0")
    caps = 'storage = "64M"\nstorage_inodes = 20000\n'
    with start(make_task, "disk2", caps) as env, start(make_task, "innocent") as other:
        assert env.watch and env.watch.tree  # the local engine: the layer itself is measured
        for tool in ("stat", "du", "find"):  # the watch runs on the host: these can't blind it
            plant(f"/usr/bin/{tool}", "echo 0", env)
        probe = threading.Thread(target=lambda: box.append(other.bash("sleep 12; echo done", timeout=60)))
        box: list = []
        probe.start()
        # a background writer that escapes the command's kill (no RETERM_CMD in its environment)
        env.bash("env -u RETERM_CMD setsid bash -c 'for i in $(seq 100); do "
                 "head -c 8M /dev/zero > /app/bg$i; sleep 0.05; done' >/dev/null 2>&1 &")
        C.time.sleep(6)
        mb = lambda: int(env.bash(f"{C.TOOLS}/bin/du -sm /app | cut -f1").output.split()[0])
        # stopped within about a second of writing past the cap (how far past: the disk's speed)
        assert 64 <= (stopped := mb()) <= 64 + 200, stopped
        C.time.sleep(1.5)
        assert mb() == stopped
        assert "head -c 8M" not in env.bash("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").output  # it is gone
        env.bash("rm -f /app/bg*")  # over the cap but not growing: the agent may clean up
        rs = [env.bash(f"head -c 48M /dev/zero > /app/c{i}; echo wrote", timeout=30) for i in range(3)]
        assert rs[0].output == "wrote\n" and "storage cap" in rs[1].output + rs[2].output, rs
        assert mb() <= 64 + 2 * 48, mb()  # at most one command's worth past the cap
        env.bash("rm -f /app/c*")
        r = env.bash("mkdir /app/many && cd /app/many && seq 200000 | xargs touch; echo finished", timeout=60)
        assert "finished" not in r.output and "storage cap" in r.output, r
        n = int(env.bash("ls /app/many | wc -l").output.split()[0])
        assert 20000 <= n < 200000, n
        probe.join()
        assert box[0].output == "done\n" and box[0].exit_code == 0, box  # the neighbour's command ran out


def test_packages_a_solution_installs_still_work_under_the_toolchain(make_task):
    """A solution that installs a Python package (pip's layout and apt's) and a program: the trusted
    verifier's Python still imports the package and test.sh still finds the program."""
    lines = bundled("dedupe-files").env_dir.joinpath("Dockerfile").read_text().splitlines()
    solve = textwrap.dedent("""\
        mkdir -p /usr/local/lib/python3.11/dist-packages/greet /usr/lib/python3/dist-packages
        echo 'def hi(): return "hi"' > /usr/local/lib/python3.11/dist-packages/greet/__init__.py
        echo 'X = 7' > /usr/lib/python3/dist-packages/aptmod.py
        printf '#!/bin/sh\\necho tool-ok\\n' > /usr/local/bin/greet-tool; chmod +x /usr/local/bin/greet-tool
        """)
    test = textwrap.dedent("""\
        mkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt
        python3 -c 'import greet, aptmod; assert greet.hi() == "hi" and aptmod.X == 7' || exit 1
        [ "$(greet-tool)" = tool-ok ] && echo 1 > /logs/verifier/reward.txt
        """)
    task = C.load_task(make_task("installs", solve=solve, test=test,
                                 dockerfile="\n".join(lines[:2]) + "\nWORKDIR /app\n"))
    with C.start_env(task) as env:
        assert env.trusted and env.verify().reward == 0.0
        env.upload(task.solution_dir, "/solution")
        env.bash("bash /solution/solve.sh")
        assert [env.verify(fresh=f).reward for f in (False, True)] == [1.0, 1.0]


class Attacker(FakeEngine):
    """Each episode's policy from its instruction's first word: FORGE plants a python3 that exits 0
    and a .pth hook, FILL writes 200k files, DEEP sends a tool call nested 1,200 deep then solves,
    anything else solves. One 05 run holds them all."""

    def __init__(self):
        self.tokenizer = C.make_tiny_tokenizer()

    def turn(self, seen: str) -> str:
        done = seen.count("<tool_response>")
        fake = "printf '#!/bin/sh\\nexit 0\\n' > /tmp/p; chmod +x /tmp/p; mv /tmp/p /usr/sbin/python3"
        plays = {"FORGE": [fake, "echo 'import os; os._exit(0)' > /usr/lib/python3/dist-packages/h.pth"],
                 "FILL": ["mkdir /app/m && cd /app/m && seq 200000 | xargs touch"],
                 "DEEP": [None, "echo ok > /app/out.txt"]}
        word = next((w for w in plays if f"{w}:" in seen), None)
        script = plays.get(word, ["echo ok > /app/out.txt"])
        if done >= len(script) or (word == "DEEP" and "malformed" in seen and done >= 1):
            return "Done."
        if script[done] is None and "malformed" not in seen:
            return '<tool_call>{"name": "bash", "arguments": ' + "[" * 1200 + "]" * 1200 + "}</tool_call>"
        return call(script[done] or script[-1])

    def generate(self, prompts, sampling, seeds=None):
        gens = []
        for p in prompts:
            ids = self.tokenizer.encode(self.turn(self.tokenizer.decode(p)), add_special_tokens=False)
            gens.append(C.Generation(ids + [self.tokenizer.eos_token_id], [0.0] * (len(ids) + 1), "stop"))
        return gens


def test_one_05_run_holds_every_attack_and_scores_the_rest(make_task, tmp_path, monkeypatch):
    ev = importlib.import_module("05_eval_tb2")
    lines = bundled("dedupe-files").env_dir.joinpath("Dockerfile").read_text().splitlines()
    dockerfile = "\n".join(lines[:2]) + "\nWORKDIR /app\n"
    test = textwrap.dedent("""\
        mkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt
        python3 -c 'import sys; sys.exit(open("/app/out.txt").read() != "ok\\n")' &&
          echo 1 > /logs/verifier/reward.txt
        """)
    toml = TOML.replace('memory = "512M"', 'memory = "512M"\nstorage_inodes = 20000')
    for name, word in (("forge", "FORGE"), ("fill", "FILL"), ("deep", "DEEP"), ("solve", "SOLVE")):
        make_task(name, instruction=f"{word}: write ok to /app/out.txt.", test=test, toml=toml,
                  dockerfile=dockerfile)
    monkeypatch.setattr(C, "make_engine", lambda *a, **k: Attacker())
    s = ev.main(["--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "ev"), "--agent", "policy",
                 "--model", "scripted", "--max-turns", "4", "--concurrency", "4"])
    rows = {r["task"]: r for r in C.read_jsonl(tmp_path / "ev" / "trials.jsonl")}
    assert {k: r["reward"] for k, r in rows.items()} == {"forge": 0.0, "fill": 0.0, "deep": 1.0, "solve": 1.0}
    assert not any(C.is_infra_error(r["error"]) for r in rows.values()) and s["n_trials"] == 4
    traj = lambda task: json.loads(next((tmp_path / "ev" / "harbor").glob(f"{task}__*/agent/trajectory.json"))
                                   .read_text())
    assert any("storage cap" in m["content"] for m in traj("fill") if m["role"] == "tool")
    assert any("RecursionError" in m["content"] for m in traj("deep") if m["role"] == "user")
