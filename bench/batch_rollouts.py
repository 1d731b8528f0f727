"""Whole batches of rollouts at once, for tests and benchmarks: the stages drive common.RolloutPool
episode by episode (04's fork is a recovery attempt submitted with its failure state's snapshot as
the image), while a test or a benchmark often wants "run these k attempts / these recovery groups
and give me the episodes". Imported by tests/ (conftest puts bench/ on sys.path) and by the bench
scripts.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common as C  # noqa: E402


def run_episodes(episodes: list[C.Episode], images: list[str | None], engine: Any, cfg: C.RolloutConfig,
                 commit: str = "none", internet: bool = True) -> dict:
    """Run every episode in a RolloutPool (an image per episode: None = its task's image, or a
    snapshot to fork); returns the pool's stats. commit: see RolloutPool.submit."""
    with C.RolloutPool(engine, cfg, internet) as pool:
        for ep, image in zip(episodes, images, strict=True):
            pool.submit(ep, image, commit)
        for _ in pool.completed():
            pass
    return pool.stats()


def run_attempts(tasks: list[C.Task], engine: Any, cfg: C.RolloutConfig, commit: str = "none",
                 internet: bool = True) -> tuple[list[C.Episode], dict]:
    """First attempts: one fresh container per entry of `tasks` (repeat a task for k attempts);
    attempt i samples with seed cfg.sampling.seed + i."""
    base = cfg.sampling.seed
    episodes = [C.first_attempt(t, engine.tokenizer, cfg, None if base is None else base + i)
                for i, t in enumerate(tasks)]
    return episodes, run_episodes(episodes, [None] * len(tasks), engine, cfg, commit, internet)


def run_recoveries(states: list[C.FailureState], tasks: dict[str, C.Task], n: int, engine: Any,
                   cfg: C.RolloutConfig, commit: str = "none", internet: bool = True
                   ) -> tuple[list[list[C.Episode]], dict]:
    """Fork n containers from each failure state and let the policy recover in each; returns
    one group of n episodes per state (04 forms its groups the same way, episode by episode)."""
    base = cfg.sampling.seed
    episodes = [C.recovery_attempt(tasks[s.task], s, engine.tokenizer, cfg,
                                   None if base is None else base + i)
                for i, s in enumerate([s for s in states for _ in range(n)])]
    images = [s.snapshot for s in states for _ in range(n)]
    stats = run_episodes(episodes, images, engine, cfg, commit, internet)
    return [episodes[k * n:(k + 1) * n] for k in range(len(states))], stats


def fork(snapshot: str, task: C.Task, n: int, internet: bool = True) -> list[C.Env]:
    """n independent containers from one snapshot image (started concurrently, on its engine)."""
    host = C.HOSTS.home(snapshot)
    with ThreadPoolExecutor(max_workers=min(n, 16)) as pool:
        futures = [pool.submit(C.start_env, task, snapshot, internet, host) for _ in range(n)]
        envs, errors = [], []
        for f in futures:
            try:
                envs.append(f.result())
            except Exception as e:
                errors.append(e)
    if errors:
        for e in envs:
            e.close()
        raise errors[0]
    return envs
