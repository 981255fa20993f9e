"""The Pareto frontier of a sweep's or a search's runs: output tok/s per GPU (what the server gives in
all) against tok/s per user (1000 / TPOT p50: how fast one answer streams). Configurations and rates
trade one for the other (more sequences at once: more in all, each slower); the frontier holds the
points no other beats on both, the only ones worth choosing between.

Only a point that passed its verdict can be on it: a hold's tokens are those of the requests sent in
it, answered in the drain too, so a server that does not keep up seems to give all it was sent (a
simulated one-sequence engine that saturates at 5 req/s "gave" 640 tok/s at 10 req/s, twice its
most)."""

from __future__ import annotations

from collections.abc import Sequence

from llmload.models import ParetoPoint, SearchResult

PNG_FILE = "pareto.png"


def point(
    *,
    configuration: str | None,
    qps: float,
    run: str,
    output_tokens_per_s: float | None,
    tpot_p50_ms: float | None,
    gpu_count: int | None,
    passed: bool | None,
) -> ParetoPoint | None:
    """The run's point; None where it lacks a figure (no answer succeeded, or none had a second token)."""
    if output_tokens_per_s is None or not tpot_p50_ms:
        return None
    return ParetoPoint(
        configuration=configuration,
        qps=qps,
        run=run,
        output_tokens_per_s_per_gpu=output_tokens_per_s / (gpu_count or 1),
        gpu_count=gpu_count,
        tokens_per_s_per_user=1000 / tpot_p50_ms,
        passed=passed,
    )


def search_points(result: SearchResult, configuration: str | None, under: str = "") -> list[ParetoPoint]:
    """One point per probe that has both figures, its run directory under `under` (the page's path to
    the search's directory)."""
    points = (
        point(configuration=configuration, qps=p.qps, run=f"{under}{p.run_id}", gpu_count=p.gpu_count,
              output_tokens_per_s=p.output_tokens_per_s, tpot_p50_ms=p.tpot_p50_ms, passed=p.passed)
        for p in result.probes
    )  # fmt: skip
    return [p for p in points if p is not None]


def dominates(a: ParetoPoint, b: ParetoPoint) -> bool:
    """`a` gives at least as much as `b` on both axes and more on one."""
    (a_all, a_user), (b_all, b_user) = _axes(a), _axes(b)
    return a_all >= b_all and a_user >= b_user and (a_all > b_all or a_user > b_user)


def _axes(p: ParetoPoint) -> tuple[float, float]:
    return p.output_tokens_per_s_per_gpu, p.tokens_per_s_per_user


def frontier(points: Sequence[ParetoPoint]) -> list[ParetoPoint]:
    """The points in their order, each marked whether it is on the frontier: it passed, and no other
    point that passed dominates it (equal points are all on it, or all off it)."""
    passed = [p for p in points if p.passed]
    return [
        p.model_copy(update={"on_frontier": bool(p.passed) and not any(dominates(o, p) for o in passed)})
        for p in points
    ]


def throughput_axis(points: Sequence[ParetoPoint]) -> str:
    """Per GPU where the runs saw GPUs; a server without one (a CPU server) counts as one unit."""
    seen = [p.gpu_count is not None for p in points]
    if all(seen):
        return "output tok/s per GPU"
    if not any(seen):
        return "output tok/s per server (no GPU seen)"
    return "output tok/s per GPU (per server where no GPU was seen)"


def verdict_word(p: ParetoPoint) -> str:
    return "not judged" if p.passed is None else "PASS" if p.passed else "FAIL"
