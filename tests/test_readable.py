"""The repository's readability rules, checked on the source (no Docker, no model): every public
function and class of common.py is used by a stage or by common.py itself (a helper only tests or
benchmarks call belongs under tests/ or bench/), no function is longer than a reader can hold, and
common.py opens with the algorithm (Part I) before the plumbing (Part II)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ROOT / "common.py"
STAGES = sorted(ROOT.glob("0[1-5]_*.py"))
MAX_LINES = 80  # any function or method
MAX_LINES_04 = 60  # 04's main and its training step: the GRPO loop a reader follows line by line
PART_I_START_BY, PART_I_MAX = 150, 800  # common.py: where Part I's first section starts; its length


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _defs(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}


def _names_used(node: ast.AST) -> set[str]:
    """Names a piece of common's code loads, annotations left out: a class that only appears in
    type hints is not used."""
    hints = set()
    for n in ast.walk(node):
        hint = (n.annotation if isinstance(n, ast.arg | ast.AnnAssign) else
                n.returns if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) else None)
        hints |= {id(h) for h in ast.walk(hint)} if hint is not None else set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in hints}


def _stage_uses(tree: ast.Module) -> set[str]:
    """What a stage takes from common: every `C.<name>`."""
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "C"}


def _unreached(tree: ast.Module, roots: set[str]) -> list[str]:
    """Top-level functions and classes no chain of uses reaches from `roots` (plus what common's
    module-level code uses: constants built at import, the CLI under __main__)."""
    defs = _defs(tree)
    todo = set(roots).union(*(_names_used(n) for n in tree.body if n not in defs.values()))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in defs and name not in seen:
            seen.add(name)
            todo |= _names_used(defs[name])
    return [name for name in defs if name not in seen]


def test_the_stages_import_common_as_C():
    """The reference check below reads a stage's uses of common as `C.<name>`."""
    for stage in STAGES:
        imports = [n for n in ast.walk(_tree(stage)) if isinstance(n, ast.Import | ast.ImportFrom)]
        aliases = [(a.name, a.asname) for n in imports if isinstance(n, ast.Import) for a in n.names]
        assert ("common", "C") in aliases, stage.name
        assert not [n for n in imports if isinstance(n, ast.ImportFrom) and n.module == "common"], stage.name


def test_every_function_and_class_of_common_is_used_by_a_stage_or_the_cli():
    """Every top-level function and class of common.py (public or not) is reached from what the
    stages call or from the CLI, through common's own code: a helper that only tests or benchmarks
    call lives under tests/ or bench/, and a function only such a helper calls goes with it."""
    tree = _tree(COMMON)
    public = [n for n in _defs(tree) if not n.startswith("_")]
    assert len(public) > 50  # the parse found common's definitions
    unused = _unreached(tree, set().union(*(_stage_uses(_tree(s)) for s in STAGES)))
    assert not unused, f"in common.py but used by no stage, nor the CLI, nor common.py itself: {unused}"


def test_the_reference_check_catches_unused_code():
    """The check above is not vacuous: a definition nobody calls is reported, so is one only it
    calls, one used only in a type hint, and its own recursive call is no use."""
    tree = ast.parse("def used():\n    return helper()\n\ndef helper():\n    return 1\n\n"
                     "def lonely(n: Hint) -> Hint:\n    return lonely(n - 1) + only_lonely()\n\n"
                     "def only_lonely():\n    return 2\n\nclass Hint:\n    pass\n")
    assert _unreached(tree, {"used"}) == ["lonely", "only_lonely", "Hint"]
    assert _unreached(tree, {"used", "lonely"}) == ["Hint"]
    assert _stage_uses(ast.parse("C.load_task(p)\nx.load_tasks(p)\n")) == {"load_task"}


def _long_functions(path: Path, limit: int) -> list[str]:
    return [f"{path.name}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for n in ast.walk(_tree(path)) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and n.end_lineno - n.lineno + 1 > limit]


def test_no_function_over_80_lines_in_common():
    assert not _long_functions(COMMON, MAX_LINES)


def test_no_function_over_80_lines_in_the_stages():
    assert not [f for s in STAGES for f in _long_functions(s, MAX_LINES)]


def test_04_main_and_training_step_fit_60_lines():
    path = next(s for s in STAGES if s.name.startswith("04_"))
    funcs = {n.name: n for n in _tree(path).body if isinstance(n, ast.FunctionDef)}
    for name in ("main", "train_on_batch"):
        assert name in funcs, f"04 has no top-level {name}()"
        length = funcs[name].end_lineno - funcs[name].lineno + 1
        assert length <= MAX_LINES_04, f"04's {name} is {length} lines"


# 04's loop, one GRPO step in order; each call is a function of 04 that holds its step
STEP_04 = ["plan_groups", "run_groups", "drop_uniform_groups", "group_rows", "sleep_engine", "train_on_batch",
           "wake_engine", "update_pool", "record_step"]
# what a reader finds one jump from the loop: the advantage formula, the fork, the clipped loss, the push
HELD_04 = {"group_rows": {"group_advantages"}, "run_groups": {"recovery_attempt"},
           "train_on_batch": {"clipped_policy_loss"}, "wake_engine": {"push_weights", "update_weights"}}


def _calls_in_order(node: ast.AST) -> list[str]:
    """The names `node` calls (f(...) or x.f(...)), in the order they appear in the source."""
    calls = sorted((n for n in ast.walk(node) if isinstance(n, ast.Call)),
                   key=lambda n: (n.lineno, n.col_offset))
    return [c.func.id if isinstance(c.func, ast.Name) else c.func.attr for c in calls
            if isinstance(c.func, ast.Name | ast.Attribute)]


def _loop_steps(tree: ast.Module) -> list[str]:
    """The STEP_04 names main's `while` loop calls, in source order."""
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    loops = [n for n in ast.walk(main) if isinstance(n, ast.While)]
    assert len(loops) == 1, f"04's main has {len(loops)} while loops"
    return [name for name in _calls_in_order(loops[0]) if name in STEP_04]


def test_04_main_loop_calls_one_grpo_step_in_order():
    """main's loop reads as the algorithm: groups -> drop uniform -> advantages -> the engine sleeps ->
    clipped update -> wake and push -> pool -> record, each a named function of 04, called once."""
    tree = _tree(next(s for s in STAGES if s.name.startswith("04_")))
    assert _loop_steps(tree) == STEP_04
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(STEP_04) <= set(defs), set(STEP_04) - set(defs)
    for step, held in HELD_04.items():
        assert held & set(_calls_in_order(defs[step])), f"04's {step} calls none of {held}"


def test_the_loop_check_catches_a_reordered_or_inlined_step():
    loop = "\n".join(["def main():", "    while go:", "        g = plan_groups()",
                       "        s = hand_off(lambda p: run_groups(p))", "        k = drop_uniform_groups(g)",
                       "        r = group_rows(k)", "        sleep_engine(e)",
                       "        x = train_on_batch(m.train(), r) if r else {}", "        wake_engine(m)",
                       "        pool.update_pool(g)", "        record_step(x)", ""])
    assert _loop_steps(ast.parse(loop)) == STEP_04
    swapped = loop.replace("sleep_engine(e)", "SWAP").replace("wake_engine(m)", "sleep_engine(e)")
    assert _loop_steps(ast.parse(swapped.replace("SWAP", "wake_engine(m)"))) != STEP_04
    inlined = loop.replace("k = drop_uniform_groups(g)", "k = [x for x in g if len(set(x.r)) > 1]")
    assert _loop_steps(ast.parse(inlined)) != STEP_04


def _parts(lines: list[str]) -> tuple[int, int, int]:
    """(line of Part I's banner, line of its first section banner, line of Part II's banner), 1-based."""
    found = [(m.group(1), i + 1) for i, line in enumerate(lines) if (m := re.match(r"# Part (I+) · ", line))]
    assert [p for p, _ in found] == ["I", "II"], f"common.py needs a Part I banner, then Part II's: {found}"
    part = dict(found)
    section = next(i + 1 for i in range(part["I"], len(lines))
                   if lines[i].startswith("# ═══") and lines[i + 2].startswith("# ═══"))
    return part["I"], section, part["II"]


def test_common_opens_with_the_algorithm():
    lines = COMMON.read_text().splitlines()
    part1, first_section, part2 = _parts(lines)
    assert first_section <= PART_I_START_BY, f"Part I's first section starts at line {first_section}"
    assert part2 - part1 <= PART_I_MAX, f"Part I runs {part2 - part1} lines"
    assert part1 < first_section < part2
