"""Each scan receives what its kind declares it reads (`Scan.reads`) and the results of the scans it declares it needs
(`Scan.needs`, `Scan.optional_needs`): anything else fails at once, naming the scan and the read
(ablation/scans/context.py). Tested on a stand-in session, on a kind's every module-level read, and on a real run."""

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sweep_helpers import SMOKE, train_in_process

import headcount
from headcount.ablation.records.address import ResultAddress
from headcount.ablation.scans import KINDS, Scan
from headcount.ablation.scans.context import DeclaredContext, UndeclaredRead, offered
from headcount.ablation.scans.layer import LayerScan
from headcount.ablation.scans.pairs import PairsScan
from headcount.ablation.scans.single_head import SingleHeadScan, single_head_delta
from headcount.config.model import AttentionConfig, ModelConfig
from headcount.model import Transformer

SCANS = Path(__file__).resolve().parents[1] / "src" / "headcount" / "ablation" / "scans"


def stand_in(**more) -> SimpleNamespace:
    """What a session offers, in part: a tiny model and an address (what every scan reads when built)."""
    cfg = ModelConfig(n_layers=2, d_model=16, n_ctx=12, vocab_size=20, attn=AttentionConfig(n_heads=4))
    return SimpleNamespace(model=Transformer(cfg), address=ResultAddress(Path("run")), **more)


def test_every_kind_declares_only_what_a_scan_context_offers():
    for kind in KINDS:
        assert KINDS[kind].reads <= offered(), kind
        assert Scan.reads <= KINDS[kind].reads, kind  # the cached-result step's reads, every kind's


def session_reads(path: Path) -> set[str]:
    """The attributes a module reads of `self.session` or of a local named `session`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "session") or (
                isinstance(owner, ast.Attribute) and owner.attr == "session"
            ):
                found.add(node.attr)
    return found


def test_each_kind_s_module_reads_only_what_the_kind_declares():
    """The reads a test run may not reach (a task's branch, a resumed scan) checked on the code itself."""
    methods = {name for name in vars(DeclaredContext) if not name.startswith("_")}
    undeclared = {}
    for kind in KINDS:
        scan = KINDS[kind]
        module = Path(__import__(scan.__module__, fromlist=["_"]).__file__)
        extra = session_reads(module) - scan.reads - methods
        if extra:
            undeclared[kind] = extra
    assert undeclared == {}
    assert session_reads(SCANS / "layer.py") == {"model"}  # the check sees a module's reads


def test_a_read_the_kind_did_not_declare_fails_at_once_naming_the_scan_and_the_read():
    class Planted(LayerScan):  # layer's masks read the model, which this kind does not declare
        kind = "planted"
        reads = Scan.reads

    scan = Planted("my_layers", None, stand_in())
    with pytest.raises(UndeclaredRead, match=r"scan 'my_layers' \(planted\) reads the session's `model` without"):
        scan.masks()
    assert len(LayerScan("layer", None, stand_in()).masks()) == 2  # declared, the same read goes through
    with pytest.raises(UndeclaredRead, match="`heads_per_layer` which a scan context does not offer"):
        getattr(scan.session, "heads_per_layer")  # noqa: B009 (the session has it; a scan context does not)


def test_a_result_read_without_declaring_its_scan_fails_at_once():
    handed = {"single_head": torch.ones(2, 4)}
    session = stand_in(provided=lambda kind, compute=True: handed[kind])
    every_pair = PairsScan("pairs", PairsScan.Settings(kind="pairs"), session)  # top_k=None: needs no scan
    with pytest.raises(UndeclaredRead, match=r"scan 'pairs' \(pairs\) reads the result of 'single_head' without"):
        single_head_delta(every_pair.session)
    top = PairsScan("pairs", PairsScan.Settings(kind="pairs", top_k=2), session)
    assert single_head_delta(top.session) is handed["single_head"]  # declared (Scan.needs): handed over
    importance = KINDS["importance"]("importance", None, session)
    assert single_head_delta(importance.session, compute=False) is handed["single_head"]  # an optional read
    with pytest.raises(UndeclaredRead, match="'single_head' without declaring it needs it"):
        single_head_delta(importance.session)  # optional: never computed for it


def test_a_scan_builds_only_the_scans_it_declares_it_needs_and_each_sees_its_own_reads():
    top = KINDS["top_heads"]("top_heads", KINDS["top_heads"].Settings(kind="top_heads"), stand_in())
    ranking = SingleHeadScan("single_head", None, top.session)  # top_heads' rank_by: declared (needs)
    assert ranking.session._scan is ranking  # its own context, its own kind's reads
    with pytest.raises(UndeclaredRead, match=r"scan 'top_heads' \(top_heads\) reads the result of 'layer'"):
        LayerScan("layer", None, top.session)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scan_context")
    mp = pytest.MonkeyPatch()
    try:
        quiet = ["ablation.progress=false", "trainer.progress_bar=false"]
        assert train_in_process(mp, root, [*SMOKE, *quiet, "ablation=[baseline]", "hydra.run.dir=run"]) == 0
    finally:
        mp.undo()
    return root / "run"


def test_a_planted_undeclared_read_fails_a_real_session(run_dir, monkeypatch):
    """single_head hands its damage over through layer_head_tensor: undeclared, the run stops there, naming it."""
    run = headcount.load_run(run_dir)
    monkeypatch.setattr(SingleHeadScan, "reads", SingleHeadScan.reads - {"layer_head_tensor"})
    with pytest.raises(UndeclaredRead, match=r"scan 'single_head' \(single_head\) reads the session's `layer_head"):
        run.scan("single_head")
    monkeypatch.undo()
    assert len(run.scan("single_head")) == 8  # declared again, it runs (2 layers of 4 heads)


def test_a_head_circuit_of_a_ranking_s_top_heads_declares_the_ranking_and_runs_after_it(run_dir):
    """head_circuit read its top-k entry's ranking undeclared: it worked only where the list ran the ranking first."""
    run = headcount.load_run(run_dir)
    scan = KINDS["head_circuit"](
        "circuit", KINDS["head_circuit"].Settings(kind="head_circuit", heads=["top2:single_head"]), stand_in()
    )
    assert scan.needs() == ["single_head"]
    table = run.scan("head_circuit", heads=["top2:single_head"], random_sets=0)
    damage = run.results("single_head", mode="zero")["delta_loss"].to_numpy()  # loss: its damage is its delta
    top2 = run.results("single_head", mode="zero")["mask"].to_numpy()[damage.argsort()[::-1][:2]]
    assert table["mask"].iloc[0] == "circuit: " + "+".join(sorted(top2))


def test_the_api_checks_a_scan_s_settings_once(run_dir, monkeypatch):
    """Settings are validated once (ablation/checks.py), on the command line (tests/test_scan_settings.py
    `test_a_session_checks_each_scan_once`) and in the API: Run.scan's session checks the scan, nothing again."""
    calls = []
    check = KINDS["pairs"].check
    monkeypatch.setattr(KINDS["pairs"], "check", classmethod(lambda cls, *a: calls.append(a) or check(*a)))
    table = headcount.load_run(run_dir).scan("pairs", top_k=2)
    assert len(calls) == 1 and len(table) == 1  # the one pair of the top 2 heads
