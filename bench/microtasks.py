"""A learnable micro task family: Harbor-format tasks a small model trained on CPU can partly solve.

    python bench/microtasks.py OUT [--train 48] [--heldout 16] [--heldout-frac 0.25] [--pool-frac 0]
                                   [--stale-frac 0] [--stale-vary [--stale-compose] [--entry-split]]
                                   [--fresh-out]
                                   [--seed 0]
    python bench/microtasks.py --model OUT_MODEL [--hidden 128 --layers 4]

Writes OUT/train/<task>/ and OUT/heldout/<task>/ (+ OUT/split.json; --pool-frac also writes
OUT/pool/, train pairs kept for training after SFT, see generate). Every task is 1-3 bash commands
whose arguments (file names, words, modes) are copied from the instruction, so a model that learns
to copy can solve unseen parameter combinations. The split is by parameters: a task is held out iff
its (first argument, destination) pair is in a held-out set of pairs, so every single value also
occurs in training, never the pair. The tests check the outcome AND that nothing else changed (stray
files in /app, /app/out or /tmp, edited inputs), so a first attempt with a wrong path or value
leaves something that must be repaired, not just redone. Every task has the same environment/ folder
content, hence one image's layers (built once, re-tagged per task). With --stale-frac, a seeded share
of the tasks of every part gets the second environment instead (STALE_DOCKERFILE, one more image): the
output folder already holds a stale file from an earlier run, which the instruction does not mention.
The plain procedure runs without an error and fails the tests (the output folder must hold only the
task's file); `ls /app/out` shows the cause, and the repair is the same on every task: a failure with
an observable cause and a general fix, unlike a copy error, which is specific to its pair. With
--fresh-out every solution starts by emptying the output folder (FRESH_STEP): a redo of the whole
procedure then repairs any failure inside /app/out (a wrong name, value or mode, a stale file), and
passes iff it copies the arguments right this time, with the failed attempt's wrong ones in context.

`--model` writes a random-init Qwen3 of the given size (tied embeddings) with the project's tiny
tokenizer plus one token per argument value, and the tiny chat template without its tool-schema
block: the policy the learning experiment trains from scratch. Its rows use SYSTEM_PROMPT.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common as C  # noqa: E402

# Each argument slot has its own vocabulary, and the policy's tokenizer holds every value as one
# token (make_model): a source is a color, a destination an animal, a written word a food, a mode
# one of six. So "which value goes here" is visible in the value itself, not only in where it stands.
# (Measured: this alone did not make copying appear sooner; many small SFT steps did, see the
# experiment.) Data files exist for every source, so any (source, destination) pair is valid.
NAMES = ["red", "blue", "green", "gold", "pink", "gray", "cyan", "lime"]
DESTS = ["fox", "owl", "elk", "yak", "emu", "seal", "wolf", "crow"]
WORDS = ["apple", "bread", "cloud", "delta", "eagle", "flame", "grape", "honey"]
MODES = ["600", "640", "644", "700", "750", "755"]
TEMPLATES = ["write", "copy", "count", "mode"]

DOCKERFILE = """FROM debian:bookworm-slim
WORKDIR /app
COPY data /app/data
RUN chmod 644 /app/data/*
"""

# The second environment: an earlier run left a file in the output folder (see write_task).
# (Measured: a stale regular file AT /app/out instead makes the plain procedure's commands fail, and the
# policy, whose first attempts never met an error in training, wrote malformed turns after the error:
# failure states unlike any recovery row, none of them recovered.)
STALE_DOCKERFILE = DOCKERFILE + "RUN mkdir /app/out && echo 'an earlier run' > /app/out/report.old\n"
STALE_STEP = ("remove the stale report.old from the output folder", "rm -f /app/out/report.old")

# --stale-vary: what an earlier run left differs by task, so the repair must be read from what the
# policy sees (an `ls`, or the error of a write), not recalled: a file or a folder under a name drawn
# per task, or a folder where the task's own output file goes (`clash`: `echo > out` fails with "Is a
# directory", `cp` silently copies into it). The names of dev and held-out tasks never occur in
# train or pool tasks, so a policy that removes a name it memorised does not repair them.
STALE_KINDS = ("file", "folder", "clash")
STALE_NAMES = {"train": ["report.old", "draft.tmp", "notes.bak", "cache.lock", "run.log", "old.csv",
                         "temp.swp", "partial.out"],
               "dev": ["stage.tmp", "build.log", "prev.bak"],
               "heldout": ["stale.dat", "junk.txt", "leftover.part"]}


# --stale-compose: a name is STEM.EXT instead, each piece one token of the policy's vocabulary
# (make_model's `words`), and the names are split by (stem, extension) pair as the tasks are by
# argument pair: every stem and extension occurs in train names, a dev or held-out name never does.
# (Dev run 1, the lists above, which the tiny tokenizer cuts into 5-10 pieces each: the SFT policy's
# dev recoveries removed their own planted entry in 8% and recovered 1%.)
STALE_STEMS = ["report", "draft", "notes", "cache", "stage", "build", "prev", "junk"]
STALE_EXTS = ["old", "tmp", "bak", "log", "part", "dat"]
STALE_PIECES = STALE_STEMS + STALE_EXTS  # make_model's `words` with --stale-compose

# --entry-split: dev and held-out tasks are twins of train tasks (the same template and arguments, so
# the same first attempt) whose output folder holds an entry of a name no train or pool task has, and
# of every kind, one of which (UNSEEN_KINDS) no train or pool task has either. Their first attempt
# fails for that entry alone; a recovery passes only by reading the failed state and removing what it
# shows, so Recovery@1 measures recovery, not the copying of unseen arguments.
UNSEEN_KINDS = ("folder",)


def composed_stale_names(seed: int, n_held: int = 6, n_dev: int = 6) -> dict[str, list[str]]:
    """The STEM.EXT names of each part for a task seed: held-out and dev take n_held and n_dev (stem,
    extension) pairs of one seeded order, train the rest; redrawn until every stem and extension is
    still in a train name."""
    pairs = [(s, e) for s in STALE_STEMS for e in STALE_EXTS]
    for attempt in range(100):
        random.Random(f"stale-names:{seed}:{attempt}").shuffle(pairs)
        train = pairs[n_held + n_dev:]
        if {s for s, _ in train} == set(STALE_STEMS) and {e for _, e in train} == set(STALE_EXTS):
            names = [f"{s}.{e}" for s, e in pairs]
            return {"heldout": names[:n_held], "dev": names[n_held:n_held + n_dev],
                    "train": names[n_held + n_dev:]}
    raise ValueError("no split of the stale names keeps every piece in train")


def stale_cause(kind: str, name: str, dst: str) -> dict:
    """The planted entry of a --stale-vary task: {kind, path, docker (the RUN line), step (its removal)}."""
    path = f"/app/out/{dst}.txt" if kind == "clash" else f"/app/out/{name}"
    make = {"file": f"mkdir -p /app/out && echo 'an earlier run' > {path}",
            "folder": f"mkdir -p {path} && echo 'an earlier run' > {path}/part.txt",
            "clash": f"mkdir -p {path}"}[kind]
    what = {"file": "stale", "folder": "stale folder", "clash": "folder in the way of"}[kind]
    return {"kind": kind, "path": path, "docker": f"RUN {make}\n",
            "step": (f"remove the {what} {Path(path).name} from the output folder", f"rm -rf {path}")}


def is_stale_step(description: str) -> bool:
    """Whether a solution step is the removal of a planted entry (STALE_STEP or a stale_cause step)."""
    return description.startswith("remove the ") and description.endswith(" from the output folder")

TASK_TOML = """version = "1.0"

[metadata]
difficulty = "easy"
category = "micro-{template}"
tags = ["micro", "{template}"]

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 30.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory = "512M"
storage = "1G"
allow_internet = false
"""

# Shared by every test.sh: stray side effects anywhere the agent is likely to write are failures.
# The bash tool keeps its cwd/env under /tmp/.reterm, which is not the agent's doing.
CHECK_CLEAN = """fail() { echo "FAIL: $*"; exit 0; }
for n in {names}; do
  [ -f /app/data/$n.txt ] && cmp -s /app/data/$n.txt /tests/data/$n.txt || fail "input $n.txt changed"
  [ "$(stat -c %a /app/data/$n.txt)" = 644 ] || fail "mode of $n.txt changed"
done
[ -z "$(ls -A /app | grep -vx -e data -e out)" ] || fail "stray files in /app: $(ls -A /app)"
[ -z "$(ls -A /app/data | grep -v '\\.txt$')" ] || fail "stray files in /app/data"
[ -z "$(ls -A /tmp | grep -vx .reterm)" ] || fail "stray files in /tmp: $(ls -A /tmp)"
"""


def data_files() -> dict[str, str]:
    """name.txt for every name: a few lines each (line counts differ, so `count` has an answer)."""
    out = {}
    for i, n in enumerate(NAMES):
        rng = random.Random(f"data:{n}")
        out[f"{n}.txt"] = "".join(f"line {rng.randint(10, 99)}\n" for _ in range(2 + i))
    return out


# The first step with --fresh-out: the procedure starts from an empty output folder, so a redo of the
# whole task from its first step also clears whatever a failed attempt (or an earlier run) left there.
FRESH_STEP = ("make an empty output folder", "rm -rf /app/out && mkdir /app/out")


def task_spec(template: str, src: str, dst: str, mode: str, fresh_out: bool = False) -> dict:
    """instruction, solve.sh steps [(description, command)] and the outcome check of one task.
    src is the first argument: a source name, or for `write` the word to write."""
    out = f"/app/out/{dst}.txt"
    mk = FRESH_STEP if fresh_out else ("make the output folder", "mkdir -p /app/out")
    only = f'[ "$(ls -A /app/out)" = "{dst}.txt" ] || fail "/app/out must hold only {dst}.txt"\n'
    if template == "write":
        return {"instruction": f"Create the file {out} containing the single word {src}.",
                "steps": [mk, (f"write {src} to {dst}", f"echo {src} > {out}")],
                "check": only + f'[ "$(cat {out})" = "{src}" ] || fail "wrong content"\n'}
    if template == "copy":
        return {"instruction": f"Copy /app/data/{src}.txt to {out}.",
                "steps": [mk, (f"copy {src} to {dst}", f"cp /app/data/{src}.txt {out}")],
                "check": only + f'cmp -s {out} /tests/data/{src}.txt || fail "wrong content"\n'}
    if template == "count":
        n = len(data_files()[f"{src}.txt"].splitlines())
        return {"instruction": f"Write the number of lines of /app/data/{src}.txt to {out}.",
                "steps": [mk, (f"count the lines of {src} into {dst}",
                               f"wc -l < /app/data/{src}.txt > {out}")],
                "check": only + f'[ "$(cat {out} | tr -d " ")" = "{n}" ] || fail "wrong count"\n'}
    if template == "mode":
        return {"instruction": f"Copy /app/data/{src}.txt to {out} and give the copy mode {mode}.",
                "steps": [mk, (f"copy {src} to {dst}", f"cp /app/data/{src}.txt {out}"),
                          (f"set the mode of {dst} to {mode}", f"chmod {mode} {out}")],
                "check": only + f'cmp -s {out} /tests/data/{src}.txt || fail "wrong content"\n'
                         f'[ "$(stat -c %a {out})" = "{mode}" ] || fail "wrong mode"\n'}
    raise ValueError(template)


def split_pairs(seed: int, frac: float, pool_frac: float = 0.0, dev_frac: float = 0.0
                ) -> dict[str, set[tuple[str, str]]]:
    """The (first argument, destination) pairs of each part, from one seeded order of all pairs:
    held-out takes the first `frac` of them, dev the next `dev_frac` of the rest, pool the next
    `pool_frac` of what is left, train the others. So the held-out pairs depend on neither dev_frac
    nor pool_frac, and dev_frac = 0 leaves every part as it was before dev existed."""
    pairs = [(a, b) for a in NAMES + WORDS for b in DESTS]
    random.Random(f"split:{seed}").shuffle(pairs)
    n_held = round(frac * len(pairs))
    n_dev = round(dev_frac * (len(pairs) - n_held))
    n_pool = round(pool_frac * (len(pairs) - n_held - n_dev))
    a, b, c = itertools.accumulate([n_held, n_dev, n_pool])
    return {"heldout": set(pairs[:a]), "dev": set(pairs[a:b]), "pool": set(pairs[b:c]),
            "train": set(pairs[c:])}


def write_task(root: Path, template: str, src: str, dst: str, mode: str, stale: bool | dict = False,
               fresh_out: bool = False, suffix: str = "") -> str:
    """One task folder; `stale`: the environment with a stale /app/out/report.old (or the entry of a
    stale_cause dict), and its removal as the solution's first step (the task's name and instruction
    do not change); `fresh_out`: the solution starts by emptying the output folder (FRESH_STEP, which
    removes a stale entry too); `suffix` ends the task's name (a twin's part)."""
    spec = task_spec(template, src, dst, mode, fresh_out)
    dockerfile, step = ((DOCKERFILE + stale["docker"], stale["step"]) if isinstance(stale, dict)
                        else (STALE_DOCKERFILE, STALE_STEP))
    key = f"{src}-{mode}" if template == "mode" else src
    name = f"micro-{template}-{key}-{dst}{suffix}"
    d = root / name
    for sub in ("environment/data", "tests/data", "solution"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "instruction.md").write_text(spec["instruction"] + "\n")
    (d / "task.toml").write_text(TASK_TOML.format(template=template))
    (d / "environment/Dockerfile").write_text(dockerfile if stale else DOCKERFILE)
    if stale and not fresh_out:
        spec["steps"].insert(0, step)
    for f, text in data_files().items():
        (d / "environment/data" / f).write_text(text)
        (d / "tests/data" / f).write_text(text)  # the verifier's own clean copies of the inputs
    solve = "#!/bin/bash\nset -euo pipefail\n" + "".join(f"\n# step: {s}\n{c}\n" for s, c in spec["steps"])
    (d / "solution/solve.sh").write_text(solve)
    test = ("#!/bin/bash\n# Outcome and side-effect check; writes the reward (0 unless everything holds).\n"
            "mkdir -p /logs/verifier\necho 0 > /logs/verifier/reward.txt\n"
            "check() {\n" + CHECK_CLEAN.replace("{names}", " ".join(NAMES)) + spec["check"]
            + 'echo PASS; echo 1 > /logs/verifier/reward.txt\n}\ncheck\n')
    (d / "tests/test.sh").write_text(test)
    return name


def generate(out: str | Path, n_train: int = 48, n_heldout: int = 16, heldout_frac: float = 0.25,
             seed: int = 0, pool_frac: float = 0.0, stale_frac: float = 0.0, fresh_out: bool = False,
             dev_frac: float = 0.0, n_dev: int = 40, stale_vary: bool = False,
             stale_compose: bool = False, entry_split: bool = False) -> dict:
    """Write up to n_train train and n_heldout held-out tasks under `out` (train/, heldout/), with
    pool_frac > 0 every task on a share of the non-held-out pairs under pool/, and with dev_frac > 0
    up to n_dev tasks on a share of them under dev/; returns the split
    {train: [...], dev: [...], pool: [...], heldout: [...], stale: [...], causes: {task: {kind, path}}}.

    The dev part is held-out-like (pairs never trained on) and is where recipe choices are judged,
    so the held-out part can stay unseen until a frozen recipe is evaluated on it.

    A task gets the stale-file environment with probability stale_frac, drawn per task from the seed
    and its name alone (so the same share in every part, and unchanged by n or the other shares).
    With stale_vary its entry is a stale_cause whose kind and name are drawn the same way, the name
    from its part's STALE_NAMES (pool tasks use the train names), with stale_compose from its part's
    composed_stale_names instead.

    The pool is for training that must not see those pairs in SFT: the learning experiment draws its
    GRPO failure states there, on pairs the policy copies rather than memorised, as on held-out.

    Parameters are drawn without repeats from all (template, first argument, destination, mode)
    combinations in one seeded order, each part taking the first of its own; a task's part depends
    only on its (first argument, destination) pair, so a larger n never moves a task across the split.
    Every mode makes a distinct `mode` task: the family has 576 tasks, 418 of them on train pairs
    at the default split (seed 0, 0.25).

    With entry_split (needs stale_vary) no argument pair is held out (heldout_frac and dev_frac are
    ignored): train and pool tasks plant only entries of kinds outside UNSEEN_KINDS, and dev and
    held-out tasks are twins of n_dev and n_heldout distinct train tasks (a seeded draw, disjoint),
    each with an entry of its own part's names and of any kind (twin_tasks)."""
    out = Path(out)
    if entry_split and not stale_vary:
        raise ValueError("entry_split plants the entries of stale_vary: set stale_vary too")
    parts = split_pairs(seed, 0.0, pool_frac) if entry_split else split_pairs(seed, heldout_frac, pool_frac,
                                                                                dev_frac)
    # write has no source file (its first argument is the word); only the mode template uses a mode
    combos = [(t, s, d, m) for t in TEMPLATES for s in (WORDS if t == "write" else NAMES) for d in DESTS
              for m in (MODES if t == "mode" else [""])]
    random.Random(f"tasks:{seed}").shuffle(combos)
    cap = {"train": n_train, "heldout": n_heldout, "pool": len(combos), "dev": n_dev}
    split: dict[str, list[str]] = {"train": [], "dev": [], "pool": [], "heldout": [], "stale": []}
    causes: dict[str, dict] = {}
    stale_names = composed_stale_names(seed) if stale_compose else STALE_NAMES
    kinds = tuple(k for k in STALE_KINDS if k not in UNSEEN_KINDS) if entry_split else STALE_KINDS
    trained = []  # the train tasks' parameters: entry_split's twins are drawn from them

    def add(part: str, template: str, src: str, dst: str, mode: str, stale: bool | dict, suffix: str = ""
            ) -> None:
        split[part].append(write_task(out / part, template, src, dst, mode, stale, fresh_out, suffix))
        if stale:
            split["stale"].append(split[part][-1])
            cause = stale if isinstance(stale, dict) else stale_cause("file", "report.old", dst)
            causes[split[part][-1]] = {"kind": cause["kind"], "path": cause["path"]}

    for template, src, dst, mode in combos:
        part = next(k for k, ps in parts.items() if (src, dst) in ps)
        if len(split[part]) < cap[part]:
            key = f"{seed}:{template}:{src}:{dst}:{mode}"
            stale: bool | dict = random.Random(f"stale:{key}").random() < stale_frac
            if stale and stale_vary:
                rng = random.Random(f"cause:{key}")
                names = stale_names.get(part, stale_names["train"])
                stale = stale_cause(rng.choice(kinds), rng.choice(names), dst)
            add(part, template, src, dst, mode, stale)
            if part == "train":
                trained.append((template, src, dst, mode))
    if entry_split:
        for part, params, cause in twin_tasks(trained, seed, n_heldout, n_dev, stale_names):
            add(part, *params, cause, suffix=f"-{part}")
    split = {k: sorted(v) for k, v in split.items()} | {"causes": causes}
    (out / "split.json").write_text(json.dumps(split, indent=1) + "\n")
    return split


def twin_tasks(trained: list[tuple[str, str, str, str]], seed: int, n_heldout: int, n_dev: int,
               names: dict[str, list[str]]) -> list[tuple[str, tuple[str, str, str, str], dict]]:
    """entry_split's dev and held-out tasks: (part, the train task's parameters, its planted entry)
    for n_heldout and n_dev distinct train tasks of one seeded order; the entry's kind is drawn from
    every kind (UNSEEN_KINDS included), its name from the part's own names."""
    order = sorted(trained)
    random.Random(f"twins:{seed}").shuffle(order)
    if n_heldout + n_dev > len(order):
        raise ValueError(f"{n_heldout} held-out + {n_dev} dev twins need as many train tasks ({len(order)})")
    out = []
    for part, params in [("heldout", p) for p in order[:n_heldout]] + [("dev", p) for p in
                                                                        order[n_heldout:n_heldout + n_dev]]:
        rng = random.Random(f"twin:{seed}:{part}:{':'.join(params)}")
        out.append((part, params, stale_cause(rng.choice(STALE_KINDS), rng.choice(names[part]), params[2])))
    return out


# the first and last line of the tool-schema block in the tiny chat template (make_model drops it)
TINY_TOOLS_BLOCK = ("{{- '# Tools\\n\\nYou have access",
                    "{{- '\\n</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' }}\n")

# the system prompt of the experiment's rows (and so of the policy's scaffold): short, like the context
SYSTEM_PROMPT = "You are a terminal agent. Call the bash tool once per turn; answer without a call when done."


def make_model(out_dir: str | Path, hidden: int = 128, layers: int = 4, heads: int = 4,
               seed: int = 0, words: list[str] = ()) -> Path:
    """A random-init Qwen3 (head_dim 32: vLLM on CPU rejects smaller) with the tiny tokenizer; `words`
    are one token each too, like the argument values (STALE_STEMS and STALE_EXTS with --stale-compose)."""
    import torch
    from tokenizers import AddedToken
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = C.make_tiny_tokenizer()
    # every argument value is one token (see NAMES), so it is copied as one token, not 2-3 pieces
    tok.add_tokens([AddedToken(w, single_word=True, normalized=False)
                    for w in NAMES + DESTS + WORDS + MODES + list(words)])
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=max(1, heads // 2),
                      head_dim=hidden // heads, max_position_embeddings=32768, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    # The project's tiny chat template without its tool-schema block: a model trained from scratch
    # never reads that block, and dropping it cuts the context before the instruction ~20x (a
    # freshly initialised attention head finds an argument among ~40 tokens far sooner than ~400).
    start, end = TINY_TOOLS_BLOCK
    assert start in C.TINY_CHAT_TEMPLATE and end in C.TINY_CHAT_TEMPLATE
    head, rest = C.TINY_CHAT_TEMPLATE.split(start, 1)
    tok.chat_template = head + "{{- '<|im_end|>\\n' }}" + rest.split(end, 1)[1]
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def env_hash(root: str | Path) -> str:
    """The distinct hashes of the tasks' environment/ folders: one for the family by construction, two
    when some tasks have the stale file (one per distinct planted entry with --stale-vary)."""
    hs = {hashlib.sha256(b"".join(p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file())).hexdigest()
          for d in Path(root).glob("*/*/environment")}
    return ",".join(sorted(hs))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?", help="folder for train/, heldout/ and split.json")
    p.add_argument("--train", type=int, default=48, help="train tasks (418 at the default split)")
    p.add_argument("--heldout", type=int, default=16, help="held-out tasks (158 at the default split)")
    p.add_argument("--heldout-frac", type=float, default=0.25, help="share of (src, dst) name pairs held out")
    p.add_argument("--pool-frac", type=float, default=0.0, help="share of the other pairs written to pool/")
    p.add_argument("--dev-frac", type=float, default=0.0,
                   help="share of the non-held-out pairs written to dev/ (never trained on)")
    p.add_argument("--dev", type=int, default=40, help="dev tasks at most")
    p.add_argument("--stale-frac", type=float, default=0.0,
                   help="share of tasks whose output folder holds a stale file already")
    p.add_argument("--stale-vary", action="store_true",
                   help="the stale entry's kind and name vary by task, held-out names unseen in training")
    p.add_argument("--stale-compose", action="store_true",
                   help="--stale-vary names are STEM.EXT, split by (stem, extension) pair")
    p.add_argument("--entry-split", action="store_true",
                   help="dev/held-out tasks: train tasks' twins with an entry of unseen name (and kind)")
    p.add_argument("--fresh-out", action="store_true",
                   help="solutions start by emptying the output folder (rm -rf /app/out && mkdir /app/out)")
    p.add_argument("--seed", type=int, default=0, help="parameter and split seed")
    p.add_argument("--model", help="write a random-init Qwen3 policy here instead")
    p.add_argument("--hidden", type=int, default=128, help="--model: hidden size (head_dim 32)")
    p.add_argument("--layers", type=int, default=4, help="--model: transformer blocks")
    a = p.parse_args(argv)
    if a.model:
        words = STALE_PIECES if a.stale_compose else []
        print(make_model(a.model, a.hidden, a.layers, heads=a.hidden // 32, seed=a.seed, words=words))
        return
    if not a.out:
        p.error("OUT is required (or --model)")
    s = generate(a.out, a.train, a.heldout, a.heldout_frac, a.seed, a.pool_frac, a.stale_frac, a.fresh_out,
                 a.dev_frac, a.dev, a.stale_vary, a.stale_compose, a.entry_split)
    print(f"{len(s['train'])} train, {len(s['dev'])} dev, {len(s['pool'])} pool, {len(s['heldout'])} held-out"
          f" tasks under {a.out}"
          f" ({len(s['stale'])} with the stale file)")


if __name__ == "__main__":
    main()
