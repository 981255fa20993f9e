"""A run of several models or LoRA adapters (`--model base:0.7 --model support-lora:0.3`): each session
asks for one of them in proportion, every record says which, the summary and report break the
figures down by model, and an adapter the server does not serve fails as `model_not_found` with the
server's own message, said at the start as well."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmload.errors import InputError
from llmload.model_mix import ModelMix, parse_model
from llmload.models import Message, Session, Turn
from llmload.plan import PlanFlags, RunPlan
from llmload.replicas import Replicas
from llmload.sim.process import SimProcess
from llmload.workload.synth import TextSynthesizer
from llmload.workload.tokens import get_tokenizer
from tests.locust_runs import LocustRun, run_locust, small_workload, write_workload


def test_a_weight_is_read_only_from_a_numeric_tail() -> None:
    assert (parse_model("base:0.7").name, parse_model("base:0.7").weight) == ("base", 0.7)
    assert (parse_model("llama3:8b").name, parse_model("llama3:8b").weight) == ("llama3:8b", 1.0)
    assert parse_model("org/model").name == "org/model"
    for bad in ("base:0", "base:-1", ":0.5"):
        with pytest.raises(InputError, match="a weight above 0"):
            parse_model(bad)
    with pytest.raises(InputError, match="each model once"):
        ModelMix.of(["a:1", "a:2"])


def test_sessions_split_by_weight_and_keep_their_model() -> None:
    mix = ModelMix.of(["base:0.7", "lora-a:0.2", "lora-b:0.1"])
    drawn = [mix.for_turn(f"s{i}~{i // 7}") for i in range(20_000)]
    for name, share in (("base", 0.7), ("lora-a", 0.2), ("lora-b", 0.1)):
        assert abs(drawn.count(name) / len(drawn) - share) < 0.01, (name, drawn.count(name))
    assert all(mix.for_turn(f"s{i}~{i // 7}") == drawn[i] for i in range(0, 20_000, 97))  # stable
    assert mix.primary == "base" and [s.weight for s in mix.normalised()] == pytest.approx([0.7, 0.2, 0.1])


def test_a_ranked_turn_asks_for_the_runs_model_of_its_rank_whatever_the_weights() -> None:
    """An agentic trace's main model (rank 0) maps onto the first --model, its next onto the second, and
    ranks beyond the run's models wrap around; an unranked turn keeps its session's weighted draw."""
    mix = ModelMix.of(["big:0.1", "small:0.9"])
    assert [mix.for_turn("s1", rank) for rank in range(5)] == ["big", "small", "big", "small", "big"]
    assert ModelMix.single("only").for_turn("s1", 3) == "only"
    assert mix.for_turn("s1") == mix.for_turn("s1", None) in {"big", "small"}


def test_a_mix_with_an_adapter_the_server_lacks(tmp_path: Path) -> None:
    with SimProcess("--itl-ms", "4") as sim:
        run = run_locust(
            sim.url, small_workload(tmp_path), tmp_path / "reports", "mix", "--target-qps", "8", "--stages", "100",
            "--stage-duration", "8", "--warmup", "0", "--arrival", "constant",
            "--model", "llmload-sim:0.6", "--model", "support-lora:0.4",
        )  # fmt: skip
    assert run.returncode == 1, run.output[-3000:]  # Locust's exit code when a request failed
    assert "model support-lora: " in run.output and "/v1/models does not list it (it lists llmload-sim)" in run.output
    records = run.records
    sent = records[records.sent_at.notna()]
    assert set(sent.model) == {"llmload-sim", "support-lora"}, sent.model.value_counts()
    assert (sent.groupby("session_id").model.nunique() == 1).all()  # a session keeps its model
    assert (sent[sent.model == "llmload-sim"].status == "ok").all()
    lora = sent[sent.model == "support-lora"]
    assert (lora.error_category == "model_not_found").all() and (lora.http_status == 404).all()
    assert lora.error_message.str.startswith("The model `support-lora` does not exist.").all()
    assert run.manifest["model"] == "llmload-sim"
    assert run.manifest["model_mix"] == [
        {"name": "llmload-sim", "weight": 0.6},
        {"name": "support-lora", "weight": 0.4},
    ]
    by_model = {g["name"]: g for g in run.summary["by_model"]}
    base, missing = by_model["llmload-sim"], by_model["support-lora"]
    assert (base["share"], missing["share"]) == (0.6, 0.4)
    assert base["failed"] == 0 and base["ok"] == base["sent"] > 0 and base["ttft_p50_ms"] is not None
    assert missing["ok"] == 0 and missing["failures"] == {"model_not_found": missing["sent"]} and missing["sent"] > 0
    assert base["sent"] + missing["sent"] == run.summary["requests"]["sent"]
    report = (run.run_dir / "report.md").read_text()
    assert "models `llmload-sim` 60%, `support-lora` 40%" in report and "## By model" in report
    assert f"| {missing['sent']} (model_not_found {missing['sent']}) |" in report
    page = (run.run_dir / "report.html").read_text()
    assert "<h2>By model</h2>" in page and '<td class="l">support-lora</td><td>40%</td>' in page


def _four_seconds_at_8_qps(tmp_path: Path, workload: Path, *flags: str) -> LocustRun:
    """A short constant-rate run of `workload` against an engine of its own."""
    with SimProcess("--itl-ms", "2") as sim:
        return run_locust(
            sim.url, workload, tmp_path / "reports", workload.stem, "--target-qps", "8", "--stages", "100",
            "--stage-duration", "4", "--warmup", "0", "--arrival", "constant", *flags,
        )  # fmt: skip


def test_a_turn_that_names_its_model_is_sent_to_it(tmp_path: Path) -> None:
    """A workload turn's own `model` is sent as it is; turns naming none get the run's (here /v1/models')."""
    synth = TextSynthesizer(get_tokenizer("cl100k_base"), seed=3)
    sessions = [
        Session(id=f"s{i}", turns=[
            Turn(messages=[Message(role="user", content=synth.text(20))], output_tokens=4,
                 model="support-lora" if i % 3 == 0 else None),
        ])
        for i in range(40)
    ]  # fmt: skip
    run = _four_seconds_at_8_qps(tmp_path, write_workload(tmp_path, "named", sessions))
    assert "model support-lora: " in run.output and "does not list it (it lists llmload-sim)" in run.output
    sent = run.records[run.records.sent_at.notna()]
    named = sent.session_id.str[1:].astype(int) % 3 == 0
    assert (sent[named].model == "support-lora").all() and (sent[named].error_category == "model_not_found").all()
    assert (sent[~named].model == "llmload-sim").all() and (sent[~named].status == "ok").all()
    assert run.manifest["model"] == "llmload-sim" and run.manifest["model_mix"] == []
    by_model = {g["name"]: g for g in run.summary["by_model"]}
    assert by_model["support-lora"]["failures"] == {"model_not_found": int(named.sum())}
    assert by_model["llmload-sim"]["share"] is None and by_model["llmload-sim"]["ok"] == int((~named).sum())


def test_a_run_of_ranked_turns_claims_no_weights(tmp_path: Path) -> None:
    """An agentic trace's turns ask for the run's models by rank: run.json lists no weighted mix for them
    (the summary's by-model table then gives no share), while a plain workload keeps its mix."""
    turn = Turn(messages=[Message(role="user", content="x")], output_tokens=2)
    ranked = write_workload(tmp_path, "ranked", [Session(id="a", turns=[turn.model_copy(update={"model_rank": 1})])])
    plain = write_workload(tmp_path, "plain", [Session(id="a", turns=[turn])])
    models = ModelMix.of(["big:0.5", "small:0.5"])
    plans = {path.stem: RunPlan.build(PlanFlags(workload=str(path), target_qps=1)) for path in (ranked, plain)}
    mixes = {
        name: plan.manifest(
            run_id="r", replicas=Replicas(("http://127.0.0.1:1",)), models=models, started_at=0.0, workers=1
        ).model_mix
        for name, plan in plans.items()
    }
    assert mixes["ranked"] == [] and [share.name for share in mixes["plain"]] == ["big", "small"]
    # what the console says at the start: weights given for ranked turns split nothing; none given, nothing said
    unused = plans["ranked"].unused_weights(models)
    assert unused is not None and unused.startswith("--model big:0.5 --model small:0.5: the weights are not used")
    assert plans["plain"].unused_weights(models) is None
    assert plans["ranked"].unused_weights(ModelMix.of(["big", "small"])) is None
    assert plans["ranked"].unused_weights(ModelMix.of(["big:0.7"])) is None


def test_a_ranked_run_says_once_at_its_start_that_the_weights_are_not_used(tmp_path: Path) -> None:
    """The console line comes once per run, whatever the number of requests, and the run goes on."""
    synth = TextSynthesizer(get_tokenizer("cl100k_base"), seed=3)
    sessions = [
        Session(id=f"s{i}", turns=[Turn(messages=[Message(role="user", content=synth.text(20))], output_tokens=4,
                                        model_rank=0)])
        for i in range(40)
    ]  # fmt: skip
    workload = write_workload(tmp_path, "ranked", sessions)
    run = _four_seconds_at_8_qps(tmp_path, workload, "--model", "llmload-sim:0.7", "--model", "other:0.3")
    assert run.returncode == 0, run.output[-3000:]
    assert run.output.count("the weights are not used") == 1, run.output[-3000:]
    assert "--model llmload-sim:0.7 --model other:0.3: the weights are not used" in run.output
    assert run.summary["requests"]["ok"] >= 20 and run.manifest["model_mix"] == []
